package instances_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/providers/fake"
)

// txCounter counts the write transactions a service opens.
type txCounter struct {
	store.Store
	n atomic.Int64
}

func (c *txCounter) Tx(ctx context.Context, fn func(q store.Queries) error) error {
	c.n.Add(1)
	return c.Store.Tx(ctx, fn)
}

// pool creates a pool on the env's node template.
func (e *env) pool() *store.Pool {
	e.t.Helper()
	pl := &store.Pool{Name: "p1", TemplateID: e.node.TemplateID, Provider: fake.Name, LifecycleClass: store.ClassEphemeral,
		TargetSize: 1, MaxSize: 11, Status: store.PoolActive, CreatedAt: t0, UpdatedAt: t0}
	if err := e.st.CreatePool(e.ctx, pl); err != nil {
		e.t.Fatal(err)
	}
	return pl
}

// A ready report takes a write transaction only when it can change the
// instance: a booting instance becomes running, a warming pool member is
// handed to the hooks. Every reconnecting agent reports ready, and for a
// running instance that write was the reconnect storm's bottleneck.
func TestAgentReadyWritesOnlyWhenItMatters(t *testing.T) {
	for _, tc := range []struct {
		name       string
		prepare    func(e *env) *store.Instance
		wantTx     int64
		wantStatus lifecycle.State
		wantHooked bool
	}{
		{"booting becomes running", func(e *env) *store.Instance { return e.provision() }, 1, lifecycle.Running, true},
		{"running, no pool: nothing to write", func(e *env) *store.Instance { return e.running() }, 0, lifecycle.Running, false},
		{"running, warming pool member: the hooks run", func(e *env) *store.Instance {
			in := e.running()
			in.PoolID, in.PoolState = e.pool().ID, lifecycle.PoolWarming
			if err := e.st.UpdateInstance(e.ctx, in); err != nil {
				e.t.Fatal(err)
			}
			return in
		}, 1, lifecycle.Running, true},
		{"running, ready pool member: nothing to write", func(e *env) *store.Instance {
			in := e.running()
			in.PoolID, in.PoolState = e.pool().ID, lifecycle.PoolReady
			if err := e.st.UpdateInstance(e.ctx, in); err != nil {
				e.t.Fatal(err)
			}
			return in
		}, 0, lifecycle.Running, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			in := tc.prepare(e)
			c := &txCounter{Store: e.svc.Store}
			e.svc.Store = c
			hooked := false
			hook := func(context.Context, store.Queries, *store.Instance) error { hooked = true; return nil }
			if err := e.svc.AgentReady(e.ctx, in.ID, hook); err != nil {
				t.Fatal(err)
			}
			if got := c.n.Load(); got != tc.wantTx {
				t.Errorf("write transactions = %d, want %d", got, tc.wantTx)
			}
			if got := e.get(in.ID).Status; got != tc.wantStatus {
				t.Errorf("status = %s, want %s", got, tc.wantStatus)
			}
			if hooked != tc.wantHooked {
				t.Errorf("hook ran = %v, want %v", hooked, tc.wantHooked)
			}
		})
	}
}

// Readiness is the service with the composition root's hooks: both of its
// calls run them, and a hook's error undoes the ready report.
func TestReadinessRunsItsHooks(t *testing.T) {
	for _, tc := range []struct {
		name       string
		asSeen     bool
		hookErr    error
		wantStatus lifecycle.State
	}{
		{"by id", false, nil, lifecycle.Running},
		{"as seen", true, nil, lifecycle.Running},
		{"a hook that fails", false, errors.New("pool refused"), lifecycle.Provisioning},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			in := e.provision()
			hooked := 0
			r := instances.Readiness{Instances: e.svc, Hooks: []instances.ReadyHook{
				func(context.Context, store.Queries, *store.Instance) error { hooked++; return tc.hookErr }}}
			var err error
			if tc.asSeen {
				err = r.AgentReadyAsSeen(e.ctx, in)
			} else {
				err = r.AgentReady(e.ctx, in.ID)
			}
			if !errors.Is(err, tc.hookErr) || hooked != 1 {
				t.Fatalf("err = %v, hook ran %d times; want %v and once", err, hooked, tc.hookErr)
			}
			if got := e.get(in.ID).Status; got != tc.wantStatus {
				t.Fatalf("status = %s, want %s", got, tc.wantStatus)
			}
		})
	}
}
