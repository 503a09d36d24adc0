package presence_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/presence"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/testkit/instancestest"
)

func live(t *testing.T, st store.Store, id store.InstanceID, at time.Time) bool {
	t.Helper()
	ps, err := st.ListPresence(context.Background(), []store.InstanceID{id})
	if err != nil {
		t.Fatal(err)
	}
	return ps[id].Live(at)
}

// A stream's presence lives while its replica renews it, ends when the
// stream closes, runs out when the replica stops renewing (a crash), and a
// replica that starts again expires what it held.
func TestTrackerLease(t *testing.T) {
	ctx := context.Background()
	st := instancestest.SQLite(t)
	clk := clock.NewFake(instancestest.T0)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a := &presence.Tracker{Store: st, Clock: clk, Log: log, Replica: "a", Lease: 15 * time.Second}
	b := &presence.Tracker{Store: st, Clock: clk, Log: log, Replica: "b", Lease: 15 * time.Second}

	s1, err := a.Open(ctx, "i-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Open(ctx, "i-2"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Open(ctx, "i-3"); err != nil {
		t.Fatal(err)
	}
	clk.Advance(10 * time.Second)
	if n, err := a.Renew(ctx); err != nil || n != 2 {
		t.Fatalf("Renew = %d, %v; replica a holds two streams", n, err)
	}
	clk.Advance(10 * time.Second) // 20 s: a renewed at 10 s, b never
	if !live(t, st, "i-1", clk.Now()) || live(t, st, "i-2", clk.Now()) {
		t.Fatal("a renewed lease must stand and an unrenewed one (a crashed replica's) run out")
	}
	a.Close(s1)
	if live(t, st, "i-1", clk.Now()) {
		t.Fatal("a closed stream's presence is still live")
	}
	// Replica a restarts: what it held is expired at once, not in 15 s.
	if err := a.Start(ctx, false); err != nil {
		t.Fatal(err)
	}
	if live(t, st, "i-3", clk.Now()) {
		t.Fatal("a restarted replica's previous streams are still live")
	}
}
