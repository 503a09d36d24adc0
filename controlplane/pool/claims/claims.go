// Package claims ends pool claims. A claim ends in two places, a release
// (the pool service) and a terminate of the claimed member (the instance
// service), and both must leave the same record, so the record is built
// here, in a leaf both can import.
package claims

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
)

// Dispositions of a closed claim (docs/design.md §4.5).
const (
	// Recycled: the member was terminated after its release.
	Recycled = "recycled"
	// Reused: the member went back to ready (reuse_without_reset).
	Reused = "reused"
	// Cordoned: the member carried a cordon marker and was fenced.
	Cordoned = "cordoned"
	// Errored: the recycle's terminate failed; the member is errored and its
	// machine may still run.
	Errored = "errored"
	// Terminated: the member was terminated while claimed.
	Terminated = "terminated"
)

// Open reports whether in carries a claim that has not been closed: it is
// claimed, or its release began (claim id still set) and did not finish.
func Open(in *store.Instance) bool {
	return in.PoolID != "" && (in.PoolState == lifecycle.PoolClaimed || in.ClaimID != "")
}

// Attribution is the payload pool.claimed carries and pool.released
// repeats, so that "who held what for how long" is one query on one kind.
func Attribution(in *store.Instance, poolName string) events.ClaimPayload {
	p := events.ClaimPayload{AcquiredBy: in.AcquiredBy, AcquiredFor: in.AcquiredFor, ClaimID: in.ClaimID, InstanceID: in.ID,
		PoolID: in.PoolID, PoolName: poolName}
	if in.PoolAcquiredAt != nil {
		p.AcquiredAt = in.PoolAcquiredAt.UTC().Format(time.RFC3339Nano)
	}
	return p
}

// Held is how long in has been claimed at now.
func Held(in *store.Instance, now time.Time) time.Duration {
	if in.PoolAcquiredAt == nil || now.Before(*in.PoolAcquiredAt) {
		return 0
	}
	return now.Sub(*in.PoolAcquiredAt)
}

// Close ends in's open claim inside q's transaction: it writes
// pool.released with the attribution, the disposition, held_seconds and,
// for a failure, its text, then clears the claim from in. The caller sets
// in's pool state and writes the row in the same transaction, so the
// record and the state change commit together or not at all.
func Close(ctx context.Context, q store.Queries, in *store.Instance, disposition, failure string, now time.Time) (time.Duration, error) {
	poolName := ""
	if p, err := q.GetPoolByID(ctx, in.PoolID); err == nil {
		poolName = p.Name
	} else if !errors.Is(err, store.ErrNotFound) {
		return 0, fmt.Errorf("close claim %s: %w", in.ClaimID, err)
	}
	held := Held(in, now)
	payload := Attribution(in, poolName).Released(disposition, failure, int64(held/time.Second), now.UTC().Format(time.RFC3339Nano))
	sev := events.Low
	msg := fmt.Sprintf("claim %s on %s (by %q for %q) closed: %s after %s", in.ClaimID, in.ID, in.AcquiredBy, in.AcquiredFor,
		disposition, held.Truncate(time.Second))
	if failure != "" {
		sev = events.Medium
		msg += ": " + failure
	}
	if _, err := (events.E{Kind: events.PoolReleased, Severity: sev, InstanceID: in.ID, PoolID: in.PoolID,
		CorrelationID: in.ClaimID.Correlation(), Message: msg, Payload: payload}).Write(ctx, q, now); err != nil {
		return 0, fmt.Errorf("close claim %s: %w", in.ClaimID, err)
	}
	in.ClaimID, in.AcquiredBy, in.AcquiredFor, in.PoolAcquiredAt = "", "", "", nil
	in.ClaimedStaleFlagged, in.HeartbeatStaleFlagged = false, false
	return held, nil
}
