package storetest

import (
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
)

// testPresence: a presence opens, renews with its replica, closes only for
// its own stream, and a replica's start expires what its predecessor left.
func testPresence(t *testing.T, s store.Store) {
	c := ctx(t)
	lease := 15 * time.Second
	open := func(id store.InstanceID, replica, stream string, at time.Time) {
		t.Helper()
		must(t, s.OpenPresence(c, &store.Presence{InstanceID: id, Replica: replica, StreamID: stream, ConnectedAt: at, LeaseUntil: at.Add(lease)}))
	}
	get := func(id store.InstanceID) *store.Presence {
		t.Helper()
		ps, err := s.ListPresence(c, []store.InstanceID{id})
		must(t, err)
		return ps[id]
	}
	open("i-1", "r1", "s1", t0)
	open("i-2", "r1", "s2", t0)
	open("i-3", "r2", "s3", t0)
	if p := get("i-1"); !p.Live(t0) || p.Live(t0.Add(lease)) || p.Replica != "r1" || p.StreamID != "s1" || !p.ConnectedAt.Equal(t0) {
		t.Fatalf("opened presence read back: %+v", p)
	}
	n, err := s.RenewPresence(c, "r1", t0.Add(time.Minute))
	must(t, err)
	if n != 2 || !get("i-1").Live(t0.Add(30*time.Second)) || get("i-3").Live(t0.Add(30*time.Second)) {
		t.Fatalf("RenewPresence(r1) renewed %d; r1's leases must run on, r2's not", n)
	}
	// A stream that ended late does not close its successor's presence,
	// even when the successor is on another replica.
	open("i-2", "r2", "s2b", t0.Add(time.Second))
	closed, err := s.ClosePresence(c, "i-2", "s2", t0.Add(2*time.Second))
	must(t, err)
	if closed || !get("i-2").Live(t0.Add(3*time.Second)) {
		t.Fatal("ClosePresence of an old stream closed the new one")
	}
	closed, err = s.ClosePresence(c, "i-2", "s2b", t0.Add(4*time.Second))
	must(t, err)
	p := get("i-2")
	if !closed || p.Live(t0.Add(4*time.Second)) || p.LostAt == nil || !p.LostAt.Equal(t0.Add(4*time.Second)) {
		t.Fatalf("closed presence read back: %+v", p)
	}
	// Reopening clears the loss.
	open("i-2", "r1", "s2c", t0.Add(5*time.Second))
	if !get("i-2").Live(t0.Add(6 * time.Second)) {
		t.Fatal("reopened presence is not live")
	}
	n, err = s.ExpirePresence(c, "r1", t0.Add(10*time.Second))
	must(t, err)
	if n != 2 || get("i-1").Live(t0.Add(11*time.Second)) || !get("i-3").Live(t0.Add(11*time.Second)) {
		t.Fatalf("ExpirePresence(r1) expired %d; only r1's must end", n)
	}
	n, err = s.ExpirePresence(c, "", t0.Add(12*time.Second))
	must(t, err)
	if n != 1 || get("i-3").Live(t0.Add(12*time.Second)) {
		t.Fatalf("ExpirePresence(all) expired %d, want the one left", n)
	}
	ps, err := s.ListPresence(c, []store.InstanceID{"i-1", "i-2", "i-3", "i-none"})
	must(t, err)
	if len(ps) != 3 || ps["i-none"] != nil {
		t.Fatalf("ListPresence = %d entries", len(ps))
	}
}

// testClaimNeedsPresence: a ready, running member is handed out only while
// its agent's presence is open and its lease unexpired.
func testClaimNeedsPresence(t *testing.T, s store.Store) {
	c := ctx(t)
	p := seedPool(t, s, "presence")
	n := seedNode(t, s, "member")
	ms := addMembers(t, s, p, n.ID, lifecycle.PoolReady, 3)
	at := t0.Add(time.Minute)
	// ms[0]: lease ran out (its replica died); ms[1]: stream closed;
	// ms[2]: present.
	must(t, s.OpenPresence(c, &store.Presence{InstanceID: ms[0].ID, Replica: "dead", StreamID: "x0", ConnectedAt: t0, LeaseUntil: at}))
	must(t, s.OpenPresence(c, &store.Presence{InstanceID: ms[1].ID, Replica: "r", StreamID: "x1", ConnectedAt: t0, LeaseUntil: at.Add(time.Hour)}))
	if _, err := s.ClosePresence(c, ms[1].ID, "x1", t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	got, err := s.ClaimPoolMembers(c, p.ID, "", []store.PoolClaim{{ClaimID: "a"}, {ClaimID: "b"}}, at)
	must(t, err)
	if len(got) != 1 || got[0].ID != ms[2].ID {
		t.Fatalf("claimed %d members; only the present one (%s) may be handed out", len(got), ms[2].ID)
	}
	_, err = s.ClaimPoolMember(c, p.ID, "", at)
	wantErr(t, err, store.ErrNotFound)
	// A member with no presence at all is not claimable either.
	in := newInstance(n.ID, lifecycle.Running)
	in.PoolID, in.PoolState = p.ID, lifecycle.PoolReady
	must(t, s.CreateInstance(c, in))
	_, err = s.ClaimPoolMember(c, p.ID, "", at)
	wantErr(t, err, store.ErrNotFound)
}
