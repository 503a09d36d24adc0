// Package presence records which replica holds each agent's stream, with a
// lease the replica renews (docs/design.md §2.10, docs/adr/0019). A pool
// claim takes only members whose presence is live, so a member whose
// stream dropped, whose replica crashed, or whose control plane restarted
// is not handed out until its agent is back.
package presence

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"

	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/clock"
)

// Defaults. The lease is what a crashed replica's agents stay claimable
// for at most; renewing at a third of it survives two lost renewals.
const (
	DefaultLease = 15 * time.Second
)

// Tracker keeps one replica's presence rows.
type Tracker struct {
	Store store.PresenceQueries
	Clock clock.Clock
	Log   *slog.Logger
	// Replica names this replica in the rows (stable across restarts, so
	// a restart can expire what it held before).
	Replica string
	// Lease is how long a renewal stands (default DefaultLease).
	Lease time.Duration
}

func (t *Tracker) lease() time.Duration {
	if t.Lease > 0 {
		return t.Lease
	}
	return DefaultLease
}

// Stream is one open stream's presence.
type Stream struct {
	InstanceID store.InstanceID
	ID         string
}

// Open records that this replica holds a new stream of instanceID.
func (t *Tracker) Open(ctx context.Context, instanceID store.InstanceID) (Stream, error) {
	now := t.Clock.Now()
	s := Stream{InstanceID: instanceID, ID: uuid.Must(uuid.NewV7()).String()}
	err := t.Store.OpenPresence(ctx, &store.Presence{InstanceID: instanceID, Replica: t.Replica, StreamID: s.ID,
		ConnectedAt: now, LeaseUntil: now.Add(t.lease())})
	if err != nil {
		return Stream{}, fmt.Errorf("presence: %w", err)
	}
	return s, nil
}

// Close records that the stream ended. It runs on the stream's way out,
// so it does not take the stream's (cancelled) context.
func (t *Tracker) Close(s Stream) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := t.Store.ClosePresence(ctx, s.InstanceID, s.ID, t.Clock.Now()); err != nil {
		// The lease still runs out: the member stops being claimable
		// within it anyway.
		t.Log.Warn("presence: closing a stream's presence failed; its lease runs out instead", "instance", s.InstanceID, "err", err)
	}
}

// Start expires what this replica's previous run left open: a replica
// that starts holds no stream. With all (one process owns the store, as
// with SQLite) it expires every presence.
func (t *Tracker) Start(ctx context.Context, all bool) error {
	replica := t.Replica
	if all {
		replica = ""
	}
	n, err := t.Store.ExpirePresence(ctx, replica, t.Clock.Now())
	if err != nil {
		return fmt.Errorf("presence: expire the previous run's streams: %w", err)
	}
	if n > 0 {
		t.Log.Info("presence: streams of the previous run expired; their members are claimable once their agents reconnect", "streams", n)
	}
	return nil
}

// Renew extends every lease this replica holds, in one statement.
func (t *Tracker) Renew(ctx context.Context) (int64, error) {
	n, err := t.Store.RenewPresence(ctx, t.Replica, t.Clock.Now().Add(t.lease()))
	if err != nil {
		return 0, fmt.Errorf("presence: renew: %w", err)
	}
	return n, nil
}

// Run renews the leases every third of the lease until ctx ends. A failed
// renewal is retried at the next beat; if the store stays away the leases
// run out, which is the truth: nobody can vouch for the agents then.
func (t *Tracker) Run(ctx context.Context) {
	tk := t.Clock.NewTicker(t.lease() / 3)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C():
			if _, err := t.Renew(ctx); err != nil && ctx.Err() == nil {
				t.Log.Warn("presence lease renewal failed; the next beat retries", "err", err)
			}
		}
	}
}
