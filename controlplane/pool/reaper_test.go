package pool_test

import (
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/pool"
	"github.com/tetherfleet/tether/controlplane/pool/claims"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/testkit/instancestest"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/fake"
)

func (e *env) tick() pool.TickResult {
	e.t.Helper()
	r, err := e.svc.Tick(e.ctx)
	if err != nil {
		e.t.Fatalf("tick: %v", err)
	}
	return r
}

// heartbeatAll keeps every running member's agent fresh.
func (e *env) heartbeatAll(p *store.Pool) {
	e.t.Helper()
	for _, in := range e.live(p) {
		if in.Status == lifecycle.Running {
			e.heartbeat(in.ID)
		}
	}
}

func (e *env) terminate(id store.InstanceID) {
	e.t.Helper()
	if _, err := e.inst.Terminate(e.ctx, id); err != nil {
		e.t.Fatal(err)
	}
}

func terminated(in *store.Instance) bool { return in.Status == lifecycle.Terminated }

// A member still warming past its timeout is terminated and replaced; so
// is one whose provision failed.
func TestReaperReplacesStuckWarmingMembers(t *testing.T) {
	eachBackend(t, func(t *testing.T, open func(testing.TB) store.Store) {
		e := newEnv(t, open)
		p := e.create("ci", 2, store.PoolMetadata{WarmingTimeoutSeconds: 300})
		if r := e.tick(); r.Replenish.Provisioned != 2 {
			t.Fatalf("first tick provisioned %d", r.Replenish.Provisioned)
		}
		e.work()
		first := e.live(p, lifecycle.PoolWarming)
		e.clk.Advance(299 * time.Second)
		if r := e.tick(); r.Recycle.Replaced != 0 {
			t.Fatalf("replaced %d before the timeout", r.Recycle.Replaced)
		}
		e.clk.Advance(2 * time.Second)
		r := e.tick()
		if r.Recycle.Replaced != 2 || r.Replenish.Provisioned != 2 {
			t.Fatalf("tick: %+v", r)
		}
		for _, in := range first {
			if got := e.get(in.ID); !terminated(got) {
				t.Fatalf("stuck member %s is %s", in.ID, got.Status)
			}
		}
		if c := e.counts(p); c.Warming != 2 {
			t.Fatalf("counts after replacement %+v", c)
		}

		// A provision that fails leaves the member in error: it is
		// replaced on the next tick, without waiting for the timeout.
		e.work()
		for _, in := range e.live(p, lifecycle.PoolWarming) {
			e.terminate(in.ID)
		}
		e.fake.FailAlways(fake.OpProvision, providers.KindPermanent)
		e.tick()
		e.work()
		broken := e.live(p, lifecycle.PoolWarming)
		if len(broken) != 2 || broken[0].Status != lifecycle.Error {
			t.Fatalf("failed provisions: %d, %v", len(broken), broken)
		}
		e.fake.ClearFailures()
		if r := e.tick(); r.Recycle.Replaced != 2 || r.Replenish.Provisioned != 2 {
			t.Fatalf("tick after failed provisions: %+v", r)
		}
	})
}

// A ready member past its TTL is recycled; one whose agent went quiet is
// recycled early, with pool.ready_stale_heartbeat_recycled.
func TestReaperRecyclesStaleReadyMembers(t *testing.T) {
	eachBackend(t, func(t *testing.T, open func(testing.TB) store.Store) {
		e := newEnv(t, open)
		p := e.create("ci", 2, store.PoolMetadata{ReadyTTLSeconds: 3600})
		ready := e.warm(p)
		quiet, chatty := ready[0], ready[1]
		for i := 0; i < 5; i++ {
			e.clk.Advance(time.Minute)
			e.heartbeat(chatty.ID)
		}
		r := e.tick()
		if r.Recycle.Recycled != 1 || r.Replenish.Provisioned != 1 || !terminated(e.get(quiet.ID)) || terminated(e.get(chatty.ID)) {
			t.Fatalf("stale heartbeat tick: %+v", r)
		}
		if evs := e.events(events.PoolReadyStaleHeartbeat, store.EventFilter{InstanceID: quiet.ID}); len(evs) != 1 || evs[0].Severity != events.Medium {
			t.Fatalf("stale heartbeat events: %v", evs)
		}
		e.work()
		for _, in := range e.live(p, lifecycle.PoolWarming) {
			e.ready(in.ID)
		}
		// Past the TTL, heartbeats or not.
		for i := 0; i < 62; i++ {
			e.clk.Advance(time.Minute)
			e.heartbeatAll(p)
		}
		r = e.tick()
		if r.Recycle.Recycled != 2 || r.Replenish.Provisioned != 2 || !terminated(e.get(chatty.ID)) {
			t.Fatalf("ttl tick: %+v", r)
		}
	})
}

// A claimed member is never recycled by the reaper: it is flagged, once
// per claim, for its TTL and for a silent agent.
func TestReaperFlagsStaleClaimsOnce(t *testing.T) {
	eachBackend(t, func(t *testing.T, open func(testing.TB) store.Store) {
		e := newEnv(t, open)
		p := e.create("ci", 1, store.PoolMetadata{ClaimedTTLSeconds: 600, ReadyTTLSeconds: 86400})
		e.warm(p)
		c, err := e.svc.Acquire(e.ctx, pool.AcquireParams{PoolName: "ci", AcquiredBy: "alice"})
		must(t, err)
		// Silent for 4 minutes: heartbeat flag only.
		e.clk.Advance(4 * time.Minute)
		if r := e.tick(); r.Recycle.Flagged != 1 {
			t.Fatalf("flagged %d", r.Recycle.Flagged)
		}
		// Heartbeats return, then stop again: still one heartbeat flag per claim.
		e.heartbeat(c.Instance.ID)
		e.tick()
		e.clk.Advance(4 * time.Minute)
		if r := e.tick(); r.Recycle.Flagged != 0 {
			t.Fatalf("a second heartbeat flag for one claim: %+v", r.Recycle)
		}
		// Past the claimed TTL: the TTL flag, once.
		e.clk.Advance(3 * time.Minute)
		if r := e.tick(); r.Recycle.Flagged != 1 {
			t.Fatalf("ttl flag: %+v", r.Recycle)
		}
		e.clk.Advance(time.Hour)
		if r := e.tick(); r.Recycle.Flagged != 0 || r.Recycle.Recycled != 0 {
			t.Fatalf("a claimed member was flagged again or recycled: %+v", r.Recycle)
		}
		in := e.get(c.Instance.ID)
		if in.PoolState != lifecycle.PoolClaimed || terminated(in) || !in.ClaimedStaleFlagged {
			t.Fatalf("claimed member: %s %s flagged %v", in.PoolState, in.Status, in.ClaimedStaleFlagged)
		}
		if n := len(e.events(events.PoolClaimedStale, store.EventFilter{CorrelationID: c.ID.Correlation()})); n != 1 {
			t.Fatalf("%d claimed_stale events", n)
		}
		if n := len(e.events(events.PoolClaimedStaleHeartbeat, store.EventFilter{CorrelationID: c.ID.Correlation()})); n != 1 {
			t.Fatalf("%d claimed_stale_heartbeat_flagged events", n)
		}
	})
}

// Errored members are retried on a bounded, backed-off ladder: a
// terminate that fails once lands on the first retry; one that always
// fails is abandoned loudly after the last attempt and never tried again.
func TestReaperTerminateLadder(t *testing.T) {
	eachBackend(t, func(t *testing.T, open func(testing.TB) store.Store) {
		t.Run("fails once", func(t *testing.T) {
			e := newEnv(t, open)
			p := e.create("ci", 1, store.PoolMetadata{})
			in := e.warm(p)[0]
			e.fake.FailNext(fake.OpTerminate, 1, providers.KindTransient)
			r, err := e.svc.Drain(e.ctx, "ci")
			must(t, err)
			if r.Drained != 0 || r.TerminateFailed != 1 || e.get(in.ID).PoolState != lifecycle.PoolErrored {
				t.Fatalf("drain: %+v", r)
			}
			// Not due yet.
			if tr := e.tick(); tr.Recycle.Retried != 0 || tr.Recycle.TerminateFailed != 0 {
				t.Fatalf("retried before the backoff: %+v", tr.Recycle)
			}
			e.clk.Advance(pool.DefaultRetryBase)
			if tr := e.tick(); tr.Recycle.Retried != 1 || tr.Recycle.TerminateFailed != 0 {
				t.Fatalf("retry tick: %+v", tr.Recycle)
			}
			if got := e.get(in.ID); !terminated(got) || got.PoolTerminateAttempts != 1 {
				t.Fatalf("after the retry: %s attempts %d", got.Status, got.PoolTerminateAttempts)
			}
		})
		t.Run("always fails", func(t *testing.T) {
			e := newEnv(t, open)
			p := e.create("ci", 1, store.PoolMetadata{ErroredTerminateMaxAttempts: 3})
			in := e.warm(p)[0]
			e.fake.Inject(fake.OpTerminate, fake.Fault{Kind: providers.KindTransient, Message: "hypervisor wedged"})
			_, err := e.svc.Drain(e.ctx, "ci")
			must(t, err)
			calls := func() int { return len(e.fake.CallsFor(fake.OpTerminate)) }
			before := calls()
			var abandoned int
			var waits []time.Duration
			last := e.clk.Now()
			for i := 0; i < 40; i++ {
				e.clk.Advance(30 * time.Second)
				n := calls()
				tr := e.tick()
				if calls() > n {
					waits = append(waits, e.clk.Now().Sub(last))
					last = e.clk.Now()
				}
				abandoned += tr.Recycle.Abandoned
			}
			got := e.get(in.ID)
			if calls()-before != 3 || got.PoolTerminateAttempts != 3 || abandoned != 1 || got.PoolNextTerminateAt != nil {
				t.Fatalf("ladder: %d retries, attempts %d, abandoned %d, next %v", calls()-before, got.PoolTerminateAttempts, abandoned, got.PoolNextTerminateAt)
			}
			// 1, 2 and 4 minutes apart (to the tick): backed off.
			want := []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute}
			for i, w := range waits {
				if w < want[i] || w > want[i]+30*time.Second {
					t.Fatalf("retry %d came %s after the last, want %s", i+1, w, want[i])
				}
			}
			evs := e.events(events.PoolTerminateAbandoned, store.EventFilter{InstanceID: in.ID})
			if len(evs) != 1 || evs[0].Severity != events.High {
				t.Fatalf("abandoned events: %v", evs)
			}
			if got.PoolState != lifecycle.PoolErrored || got.Status != lifecycle.Running {
				t.Fatalf("abandoned member: %s %s", got.PoolState, got.Status)
			}
		})
	})
}

// Dead member records past the retention window are pruned, with their
// node once nothing is left on it; a node shared with a live instance is
// never deleted. Retention 0 keeps everything.
func TestReaperPrunesDeadRecords(t *testing.T) {
	eachBackend(t, func(t *testing.T, open func(testing.TB) store.Store) {
		e := newEnv(t, open)
		p := e.create("ci", 2, store.PoolMetadata{RecordRetentionDays: intp(7)})
		keep := e.create("keep", 1, store.PoolMetadata{RecordRetentionDays: intp(0)})
		members := e.warm(p)
		kept := e.warm(keep)
		if _, err := e.svc.Pause(e.ctx, "ci"); err != nil { // no replacements in the way
			t.Fatal(err)
		}
		for _, in := range append(members, kept...) {
			e.terminate(in.ID)
		}
		// The first member's node also hosts a live instance now.
		shared, err := e.st.GetNodeByID(e.ctx, members[0].NodeID)
		must(t, err)
		live, err := e.inst.Provision(e.ctx, instancesProvision{Node: shared.Name, Provider: fake.Name})
		must(t, err)
		if _, err := e.svc.Activate(e.ctx, "ci"); err != nil {
			t.Fatal(err)
		}

		e.clk.Advance(6 * 24 * time.Hour)
		if r := e.tick(); r.Recycle.Pruned != 0 {
			t.Fatalf("pruned inside the window: %+v", r.Recycle)
		}
		e.clk.Advance(25 * time.Hour)
		r := e.tick()
		if r.Recycle.Pruned != 2 || r.Recycle.NodesDeleted != 1 {
			t.Fatalf("prune tick: %+v", r.Recycle)
		}
		for _, in := range members {
			if _, err := e.st.GetInstance(e.ctx, in.ID); err == nil {
				t.Fatalf("dead member %s kept", in.ID)
			}
		}
		if _, err := e.st.GetNodeByID(e.ctx, members[0].NodeID); err != nil {
			t.Fatalf("a node with a live instance was deleted: %v", err)
		}
		if _, err := e.st.GetInstance(e.ctx, live.Instance.ID); err != nil {
			t.Fatalf("the live instance went: %v", err)
		}
		if _, err := e.st.GetNodeByID(e.ctx, members[1].NodeID); err == nil {
			t.Fatal("the empty node of a pruned member was kept")
		}
		for _, in := range kept {
			if _, err := e.st.GetInstance(e.ctx, in.ID); err != nil {
				t.Fatalf("retention 0 pruned %s", in.ID)
			}
		}
	})
}

// A member left draining by a release that died before its terminate is
// terminated by the reaper after the grace, and its claim closed.
func TestReaperFinishesAnInterruptedRelease(t *testing.T) {
	eachBackend(t, func(t *testing.T, open func(testing.TB) store.Store) {
		e := newEnv(t, open)
		p := e.create("ci", 1, store.PoolMetadata{ReadyTTLSeconds: 86400})
		e.warm(p)
		c, err := e.svc.Acquire(e.ctx, pool.AcquireParams{PoolName: "ci", AcquiredBy: "alice"})
		must(t, err)
		in := e.get(c.Instance.ID)
		in.PoolState = lifecycle.PoolDraining // what Release commits before it terminates
		must(t, e.st.UpdateInstance(e.ctx, in))
		e.heartbeatAll(p)
		if r := e.tick(); r.Recycle.Recycled != 0 {
			t.Fatalf("a fresh release was taken over: %+v", r.Recycle)
		}
		e.clk.Advance(pool.DefaultDrainingGrace)
		e.heartbeatAll(p)
		if r := e.tick(); r.Recycle.Recycled != 1 {
			t.Fatalf("leftover not recycled: %+v", r.Recycle)
		}
		if !terminated(e.get(in.ID)) {
			t.Fatal("leftover not terminated")
		}
		rel := e.events(events.PoolReleased, store.EventFilter{CorrelationID: c.ID.Correlation()})
		if len(rel) != 1 || payload(t, rel[0])["disposition"] != claims.Recycled {
			t.Fatalf("claim not closed: %v", rel)
		}
	})
}

// The incident, case by case: a drain whose terminate fails says so and
// never counts it drained; the failed member is errored with a trail and
// retried; the drained pool is not re-provisioned; re-activating restores
// its target.
func TestDrainIsTruthful(t *testing.T) {
	eachBackend(t, func(t *testing.T, open func(testing.TB) store.Store) {
		e := newEnv(t, open)
		p := e.create("ci", 4, store.PoolMetadata{})
		e.warm(p)
		c, err := e.svc.Acquire(e.ctx, pool.AcquireParams{PoolName: "ci"})
		must(t, err)
		e.fake.FailNext(fake.OpTerminate, 1, providers.KindTransient)
		r, err := e.svc.Drain(e.ctx, "ci")
		must(t, err)
		if r.Drained != 2 || r.TerminateFailed != 1 || r.ClaimedRemaining != 1 || len(r.FailedIDs) != 1 {
			t.Fatalf("drain: drained %d failed %d claimed %d ids %v", r.Drained, r.TerminateFailed, r.ClaimedRemaining, r.FailedIDs)
		}
		failed := e.get(r.FailedIDs[0])
		if failed.PoolState != lifecycle.PoolErrored || terminated(failed) || failed.ErrorMessage == "" {
			t.Fatalf("failed member: %s %s %q", failed.PoolState, failed.Status, failed.ErrorMessage)
		}
		evs := e.events(events.PoolTerminateFailed, store.EventFilter{PoolID: p.ID})
		if len(evs) != 1 || evs[0].Severity != events.High {
			t.Fatalf("terminate_failed events: %v", evs)
		}
		if ids, _ := payload(t, evs[0])["failed_instance_ids"].([]any); len(ids) != 1 || ids[0] != failed.ID.String() {
			t.Fatalf("event ids: %v", payload(t, evs[0]))
		}
		if pl := e.pool("ci"); pl.Status != store.PoolDraining || pl.TargetSize != 4 {
			t.Fatalf("pool after drain: %s target %d", pl.Status, pl.TargetSize)
		}
		// The next ticks retry the errored member and provision nothing.
		e.clk.Advance(pool.DefaultRetryBase)
		tr := e.tick()
		if tr.Replenish.Provisioned != 0 || tr.Recycle.Retried != 1 || !terminated(e.get(failed.ID)) {
			t.Fatalf("tick on a draining pool: %+v", tr)
		}
		// The claimed member runs out its work, then is released.
		if in := e.get(c.Instance.ID); in.PoolState != lifecycle.PoolClaimed || terminated(in) {
			t.Fatal("drain touched a claimed member")
		}
		rel, err := e.svc.Release(e.ctx, c.Instance.ID, "alice")
		must(t, err)
		if rel.Disposition != claims.Recycled {
			t.Fatalf("release from a draining pool: %s", rel.Disposition)
		}
		if _, err := e.svc.Activate(e.ctx, "ci"); err != nil {
			t.Fatal(err)
		}
		if tr := e.tick(); tr.Replenish.Provisioned != 4 {
			t.Fatalf("re-activated pool provisioned %d", tr.Replenish.Provisioned)
		}
	})
}

// A draining pool keeps nothing warm: members still warming when it was
// drained, and any that became ready since, are recycled by the next tick.
func TestDrainingPoolRecyclesWarmingMembers(t *testing.T) {
	e := newEnv(t, instancestest.SQLite)
	p := e.create("ci", 3, store.PoolMetadata{})
	e.tick()
	e.work()
	r, err := e.svc.Drain(e.ctx, "ci")
	must(t, err)
	if r.Drained != 0 {
		t.Fatalf("drained %d warming members", r.Drained)
	}
	e.ready(e.live(p, lifecycle.PoolWarming)[0].ID) // ready after the drain
	tr := e.tick()
	if tr.Recycle.Recycled != 3 || tr.Replenish.Provisioned != 0 || len(e.live(p)) != 0 {
		t.Fatalf("tick: %+v, %d live", tr, len(e.live(p)))
	}
}

// Nothing accumulates: a month of churn leaves at most the retention
// window's worth of dead records (and nodes).
func TestDeadRecordsDoNotAccumulate(t *testing.T) {
	e := newEnv(t, instancestest.SQLite)
	p := e.create("ci", 2, store.PoolMetadata{RecordRetentionDays: intp(3)})
	for day := 0; day < 30; day++ {
		e.tick()
		e.work()
		for _, in := range e.live(p, lifecycle.PoolWarming) {
			e.ready(in.ID)
		}
		for i := 0; i < 2; i++ {
			c, err := e.svc.Acquire(e.ctx, pool.AcquireParams{PoolName: "ci"})
			must(t, err)
			if _, err := e.svc.Release(e.ctx, c.Instance.ID, "ci"); err != nil {
				t.Fatal(err)
			}
		}
		e.clk.Advance(24 * time.Hour)
	}
	e.tick()
	rows := len(e.members(p))
	nodes, err := e.st.ListNodes(e.ctx, store.NodeFilter{TemplateID: p.TemplateID}, store.Page{Limit: store.MaxPageSize})
	must(t, err)
	// Two dead a day for the 3-day window (plus the day in progress), and
	// the two live members.
	if rows > 2*4+2 || len(nodes) != rows {
		t.Fatalf("after 30 days of churn: %d member rows, %d nodes", rows, len(nodes))
	}
}
