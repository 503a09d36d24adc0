package session

import (
	"math/rand/v2"
	"time"
)

// Backoff computes reconnect delays with "full jitter": attempt n sleeps a
// uniformly random time in [0, min(Cap, Base·2^n)]. Spreading each delay
// over the whole interval, rather than adding a little jitter to a fixed
// delay, is what keeps a thousand agents that lost the control plane at
// the same moment from coming back at the same moment.
type Backoff struct {
	Base time.Duration // default 500 ms
	Cap  time.Duration // default 30 s
	// Int64N returns a uniform value in [0, n); default math/rand/v2.
	Int64N func(n int64) int64
}

// DefaultBackoff is 500 ms doubling to a 30 s cap, drawing from r (nil:
// the global source).
func DefaultBackoff(r *rand.Rand) Backoff {
	b := Backoff{Base: 500 * time.Millisecond, Cap: 30 * time.Second}
	if r != nil {
		b.Int64N = r.Int64N
	}
	return b
}

// Ceiling is the upper bound of attempt n's delay: min(Cap, Base·2^n).
func (b Backoff) Ceiling(attempt int) time.Duration { return b.ceiling(attempt, 0) }

// ceiling is Ceiling with the cap raised to at least floor.
func (b Backoff) ceiling(attempt int, floor time.Duration) time.Duration {
	base, limit := b.Base, b.Cap
	if base <= 0 {
		base = 500 * time.Millisecond
	}
	if limit <= 0 {
		limit = 30 * time.Second
	}
	limit = max(limit, floor)
	d := base
	for i := 0; i < attempt && d < limit; i++ {
		d *= 2
	}
	return min(d, limit)
}

// Delay draws attempt n's delay (n counts from 0).
func (b Backoff) Delay(attempt int) time.Duration { return b.DelaySpread(attempt, 0) }

// DelaySpread draws attempt n's delay when the control plane asked its
// fleet to spread reconnections over a window (Settings.reconnect_spread_ms).
//
// The first attempt after losing a stream (n == 0) draws over the whole
// window, when that is longer than the back-off's own step: that is what
// brings a large fleet that lost its control plane at once back at the
// rate the control plane can admit. Later attempts draw over the
// back-off's step again, which climbs to max(Cap, spread): an agent whose
// attempt failed in a storm tries again within a second or two instead of
// drawing a fresh place anywhere in the window (which, at 19,000 agents,
// sent every failure up to 38 s to the back of the storm), and an agent
// whose control plane stays down slows to the fleet's pace.
func (b Backoff) DelaySpread(attempt int, spread time.Duration) time.Duration {
	n := b.Int64N
	if n == nil {
		n = rand.Int64N
	}
	ceil := b.ceiling(attempt, spread)
	if attempt == 0 {
		ceil = max(ceil, spread)
	}
	return time.Duration(n(int64(ceil) + 1))
}
