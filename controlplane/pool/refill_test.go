package pool_test

import (
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"testing"

	"github.com/tetherfleet/tether/controlplane/pool"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/testkit/instancestest"
)

// Whatever takes a member out of a pool's counts starts its replacement at
// once, through the nudge, not on the reaper's next tick: the fake clock
// never moves and the reaper never runs here. Paused pools stay as they
// are, and max_size holds.
func TestCountChangesReplenishWithoutTheTick(t *testing.T) {
	maxOf := func(n int) *int { return &n }
	tests := []struct {
		name    string
		target  int
		max     *int
		act     func(e *env, p *store.Pool, ready []*store.Instance)
		warming int // members warming once the nudges are served
	}{
		{"a claim", 2, nil, func(e *env, p *store.Pool, _ []*store.Instance) { acquire(e, p) }, 1},
		{"a release that recycles, under a binding max_size", 1, maxOf(1), func(e *env, p *store.Pool, _ []*store.Instance) {
			c := acquire(e, p)
			if n := e.svc.ServeNudges(e.ctx); n == 0 || e.counts(p).Warming != 0 {
				e.t.Fatalf("max_size 1 with one claimed member: served %d nudge(s), counts %+v", n, e.counts(p))
			}
			if _, err := e.svc.Release(e.ctx, c.Instance.ID, "alice"); err != nil {
				e.t.Fatal(err)
			}
		}, 1},
		{"a member terminated", 2, nil, func(e *env, _ *store.Pool, ready []*store.Instance) {
			if _, err := e.inst.Terminate(e.ctx, ready[0].ID); err != nil {
				e.t.Fatal(err)
			}
		}, 1},
		{"a member fenced by a cordon", 2, nil, func(e *env, _ *store.Pool, ready []*store.Instance) {
			if _, _, err := e.inst.Cordon(e.ctx, ready[0].ID, "suspect disk", "bob"); err != nil {
				e.t.Fatal(err)
			}
		}, 1},
		{"a paused pool is not replenished", 2, nil, func(e *env, p *store.Pool, ready []*store.Instance) {
			if _, err := e.svc.Pause(e.ctx, p.Name); err != nil {
				e.t.Fatal(err)
			}
			if _, err := e.inst.Terminate(e.ctx, ready[0].ID); err != nil {
				e.t.Fatal(err)
			}
		}, 0},
		{"max_size holds after a claim", 2, maxOf(2), func(e *env, p *store.Pool, _ []*store.Instance) { acquire(e, p) }, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, instancestest.SQLite)
			v, err := e.svc.Create(e.ctx, pool.CreateParams{Name: "ci", Template: e.tpl.Name, Provider: "fake", TargetSize: tc.target, MaxSize: tc.max})
			must(t, err)
			p := v.Pool
			ready := e.warm(p)
			if len(ready) != tc.target {
				t.Fatalf("warmed %d, want %d", len(ready), tc.target)
			}
			for e.svc.ServeNudges(e.ctx) > 0 { // what creating and warming asked for
			}
			tc.act(e, p, ready)
			served := e.svc.ServeNudges(e.ctx)
			if served == 0 {
				t.Fatalf("nothing nudged a replenish; counts %+v", e.counts(p))
			}
			if got := e.counts(p).Warming; got != tc.warming {
				t.Fatalf("warming %d after the nudge, want %d (counts %+v)", got, tc.warming, e.counts(p))
			}
			if tc.warming == 0 {
				return
			}
			e.work()
			for _, in := range e.live(p, lifecycle.PoolWarming) {
				e.ready(in.ID)
			}
			if c := e.counts(p); c.Ready != tc.target {
				t.Fatalf("back at target? counts %+v, target %d", c, tc.target)
			}
		})
	}
}

func acquire(e *env, p *store.Pool) *pool.Claim {
	e.t.Helper()
	c, err := e.svc.Acquire(e.ctx, pool.AcquireParams{PoolID: p.ID, AcquiredBy: "alice"})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}
