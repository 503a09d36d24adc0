package lifecycle

import (
	"errors"
	"fmt"
	"slices"
)

// PoolState is a pool member's state (docs/design.md §4). It lives beside the
// instance states because both describe one instance row and both are shared
// by the store and everything above it.
type PoolState string

// The pool member states. NoPool is the state of an instance that belongs to
// no pool.
const (
	NoPool       PoolState = ""
	PoolWarming  PoolState = "warming"
	PoolReady    PoolState = "ready"
	PoolClaimed  PoolState = "claimed"
	PoolDraining PoolState = "draining"
	PoolErrored  PoolState = "errored"
)

// ErrUnknownPoolState marks a pool state outside the list.
var ErrUnknownPoolState = errors.New("unknown pool member state")

var allPoolStates = []PoolState{PoolWarming, PoolReady, PoolClaimed, PoolDraining, PoolErrored}

// PoolStates returns the five member states (not NoPool).
func PoolStates() []PoolState { return slices.Clone(allPoolStates) }

// ParsePoolState converts stored or user text into a PoolState; "" is NoPool.
func ParsePoolState(s string) (PoolState, error) {
	st := PoolState(s)
	if st != NoPool && !slices.Contains(allPoolStates, st) {
		return "", fmt.Errorf("%w %q", ErrUnknownPoolState, s)
	}
	return st, nil
}
