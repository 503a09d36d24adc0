package instances_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/fake"
)

// pooled makes a running instance a member of a pool in poolState.
func (e *env) pooled(poolState lifecycle.PoolState) *store.Instance {
	e.t.Helper()
	in := e.running()
	pl, err := e.st.GetPool(e.ctx, "p1")
	if err != nil {
		pl = &store.Pool{Name: "p1", TemplateID: e.node.TemplateID, Provider: fake.Name, LifecycleClass: store.ClassEphemeral,
			TargetSize: 1, MaxSize: 11, Status: store.PoolActive, CreatedAt: t0, UpdatedAt: t0}
		if err := e.st.CreatePool(e.ctx, pl); err != nil {
			e.t.Fatal(err)
		}
	}
	in.PoolID, in.PoolState = pl.ID, poolState
	if err := e.st.UpdateInstance(e.ctx, in); err != nil {
		e.t.Fatal(err)
	}
	return in
}

func TestCordon(t *testing.T) {
	tests := []struct {
		name      string
		poolState lifecycle.PoolState // NoPool is not pooled
		code      codes.Code
		state     string
		poolAfter lifecycle.PoolState
	}{
		{"not pooled", lifecycle.NoPool, codes.OK, instances.CordonNotPooled, lifecycle.NoPool},
		{"ready member is fenced", lifecycle.PoolReady, codes.OK, instances.CordonFenced, lifecycle.PoolDraining},
		{"claimed member gets the marker only", lifecycle.PoolClaimed, codes.OK, instances.CordonClaimed, lifecycle.PoolClaimed},
		{"draining member", lifecycle.PoolDraining, codes.OK, instances.CordonAlreadyFenced, lifecycle.PoolDraining},
		{"warming member refused", lifecycle.PoolWarming, codes.FailedPrecondition, "", lifecycle.PoolWarming},
		{"errored member refused", lifecycle.PoolErrored, codes.FailedPrecondition, "", lifecycle.PoolErrored},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			var in *store.Instance
			if tc.poolState == lifecycle.NoPool {
				in = e.running()
			} else {
				in = e.pooled(tc.poolState)
			}
			got, state, err := e.svc.Cordon(e.ctx, in.ID, "kernel patch window", "alice")
			wantCode(t, err, tc.code)
			after := e.get(in.ID)
			if after.PoolState != tc.poolAfter || after.Status != lifecycle.Running {
				t.Fatalf("pool state %q status %s, want %q running", after.PoolState, after.Status, tc.poolAfter)
			}
			if err != nil {
				if after.Cordon != nil {
					t.Fatal("a refused cordon left a marker")
				}
				return
			}
			c := got.Cordon
			if state != tc.state || c == nil || c.By != "alice" || c.Reason != "kernel patch window" || c.PoolStateBefore != tc.poolState {
				t.Fatalf("cordon_state %q marker %+v", state, c)
			}
			if !e.hasEvent(in.ID, events.InstanceCordoned) {
				t.Fatal("no cordoned event")
			}
			// Cordoned already, or a blank reason: refused.
			_, _, err = e.svc.Cordon(e.ctx, in.ID, "again", "bob")
			wantCode(t, err, codes.FailedPrecondition)
		})
	}
	e := newEnv(t)
	in := e.running()
	_, _, err := e.svc.Cordon(e.ctx, in.ID, "  ", "alice")
	wantCode(t, err, codes.InvalidArgument)
}

func TestUncordon(t *testing.T) {
	t.Run("restores a member this cordon fenced", func(t *testing.T) {
		e := newEnv(t)
		in := e.pooled(lifecycle.PoolReady)
		if _, _, err := e.svc.Cordon(e.ctx, in.ID, "maintenance", "alice"); err != nil {
			t.Fatal(err)
		}
		e.clk.Advance(3600e9)
		got, state, err := e.svc.Uncordon(e.ctx, in.ID, "alice")
		if err != nil || state != instances.UncordonRestored || got.PoolState != lifecycle.PoolReady || got.Cordon != nil ||
			got.PoolReadyAt == nil || !got.PoolReadyAt.Equal(e.clk.Now()) {
			t.Fatalf("uncordon: %q %+v %v", state, got, err)
		}
		if !e.hasEvent(in.ID, events.InstanceUncordoned) {
			t.Fatal("no uncordoned event")
		}
	})
	t.Run("refuses a fenced member that is not running", func(t *testing.T) {
		e := newEnv(t)
		in := e.pooled(lifecycle.PoolReady)
		if _, _, err := e.svc.Cordon(e.ctx, in.ID, "maintenance", "alice"); err != nil {
			t.Fatal(err)
		}
		if _, err := e.svc.Stop(e.ctx, in.ID); err != nil {
			t.Fatal(err)
		}
		_, _, err := e.svc.Uncordon(e.ctx, in.ID, "alice")
		wantCode(t, err, codes.FailedPrecondition)
		if !strings.Contains(err.Error(), "start it") || e.get(in.ID).Cordon == nil {
			t.Fatalf("refusal %v; the marker must stay", err)
		}
	})
	t.Run("clears a marker on a member that left draining", func(t *testing.T) {
		e := newEnv(t)
		in := e.pooled(lifecycle.PoolReady)
		if _, _, err := e.svc.Cordon(e.ctx, in.ID, "maintenance", "alice"); err != nil {
			t.Fatal(err)
		}
		cur := e.get(in.ID)
		cur.PoolState = lifecycle.PoolErrored
		if err := e.st.UpdateInstance(e.ctx, cur); err != nil {
			t.Fatal(err)
		}
		got, state, err := e.svc.Uncordon(e.ctx, in.ID, "alice")
		if err != nil || state != instances.UncordonCleared || got.PoolState != lifecycle.PoolErrored || got.Cordon != nil {
			t.Fatalf("uncordon: %q %+v %v", state, got, err)
		}
	})
	t.Run("clears a not pooled instance, and is a no-op without a marker", func(t *testing.T) {
		e := newEnv(t)
		in := e.running()
		if _, _, err := e.svc.Cordon(e.ctx, in.ID, "maintenance", "alice"); err != nil {
			t.Fatal(err)
		}
		if _, state, err := e.svc.Uncordon(e.ctx, in.ID, "alice"); err != nil || state != instances.UncordonCleared {
			t.Fatalf("%q %v", state, err)
		}
		if _, state, err := e.svc.Uncordon(e.ctx, in.ID, "alice"); err != nil || state != instances.UncordonNotCordoned {
			t.Fatalf("%q %v", state, err)
		}
	})
}

func TestDrain(t *testing.T) {
	t.Run("cordons then stops", func(t *testing.T) {
		e := newEnv(t)
		in := e.pooled(lifecycle.PoolReady)
		got, state, err := e.svc.Drain(e.ctx, in.ID, "retire", "alice")
		if err != nil || state != instances.CordonFenced || got.Status != lifecycle.Stopped || got.PoolState != lifecycle.PoolDraining {
			t.Fatalf("drain: %q %+v %v", state, got, err)
		}
	})
	t.Run("works on a held instance and keeps an earlier cordon", func(t *testing.T) {
		e := newEnv(t)
		in := e.running()
		if _, err := e.svc.Hold(e.ctx, in.ID, "do not touch", "alice"); err != nil {
			t.Fatal(err)
		}
		if _, _, err := e.svc.Cordon(e.ctx, in.ID, "first", "alice"); err != nil {
			t.Fatal(err)
		}
		got, state, err := e.svc.Drain(e.ctx, in.ID, "retire", "bob")
		if err != nil || state != instances.CordonAlreadyCordoned || got.Status != lifecycle.Stopped || got.Cordon.Reason != "first" {
			t.Fatalf("drain: %q %+v %v", state, got, err)
		}
	})
	t.Run("a cordon refusal aborts before the stop", func(t *testing.T) {
		e := newEnv(t)
		in := e.pooled(lifecycle.PoolWarming)
		_, _, err := e.svc.Drain(e.ctx, in.ID, "retire", "alice")
		wantCode(t, err, codes.FailedPrecondition)
		if len(e.fake.CallsFor(fake.OpStop)) != 0 || e.get(in.ID).Status != lifecycle.Running {
			t.Fatal("the stop ran after a refused cordon")
		}
	})
	t.Run("a failed stop is an error, with the cordon left in place", func(t *testing.T) {
		e := newEnv(t)
		in := e.running()
		e.fake.Inject(fake.OpStop, fake.Fault{Kind: providers.KindTransient})
		_, state, err := e.svc.Drain(e.ctx, in.ID, "retire", "alice")
		wantCode(t, err, codes.Unavailable)
		if state != instances.CordonNotPooled || e.get(in.ID).Cordon == nil || e.get(in.ID).Status != lifecycle.Running {
			t.Fatalf("state %q, instance %+v", state, e.get(in.ID))
		}
	})
	t.Run("refused for the control plane's own host", func(t *testing.T) {
		e := newEnv(t)
		in := e.running()
		e.svc.SelfInstanceIDs = []string{in.ID.String()}
		_, _, err := e.svc.Drain(e.ctx, in.ID, "retire", "alice")
		wantCode(t, err, codes.FailedPrecondition)
		if e.get(in.ID).Cordon != nil {
			t.Fatal("a refused drain cordoned")
		}
	})
	t.Run("blank reason", func(t *testing.T) {
		e := newEnv(t)
		in := e.running()
		_, _, err := e.svc.Drain(e.ctx, in.ID, "", "alice")
		wantCode(t, err, codes.InvalidArgument)
	})
}

// Terminating a claimed member closes its claim.
func TestTerminateClosesAClaim(t *testing.T) {
	e := newEnv(t)
	in := e.pooled(lifecycle.PoolClaimed)
	if _, err := e.svc.Terminate(e.ctx, in.ID); err != nil {
		t.Fatal(err)
	}
	if !e.hasEvent(in.ID, events.PoolReleased) || e.get(in.ID).PoolState == lifecycle.PoolClaimed {
		t.Fatalf("claim left open: %v", e.eventKinds(in.ID))
	}
}
