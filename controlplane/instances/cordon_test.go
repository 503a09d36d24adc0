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
func (e *env) pooled(poolState string) *store.Instance {
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
		poolState string // "" is not pooled
		code      codes.Code
		state     string
		poolAfter string
	}{
		{"not pooled", "", codes.OK, instances.CordonNotPooled, ""},
		{"ready member is fenced", store.PoolStateReady, codes.OK, instances.CordonFenced, store.PoolStateDraining},
		{"claimed member gets the marker only", store.PoolStateClaimed, codes.OK, instances.CordonClaimed, store.PoolStateClaimed},
		{"draining member", store.PoolStateDraining, codes.OK, instances.CordonAlreadyFenced, store.PoolStateDraining},
		{"warming member refused", store.PoolStateWarming, codes.FailedPrecondition, "", store.PoolStateWarming},
		{"errored member refused", store.PoolStateErrored, codes.FailedPrecondition, "", store.PoolStateErrored},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			var in *store.Instance
			if tc.poolState == "" {
				in = e.running()
			} else {
				in = e.pooled(tc.poolState)
			}
			got, state, err := e.svc.Cordon(e.ctx, in.ID, "kernel patch window", "alice")
			wantCode(t, err, tc.code)
			after := e.get(in.ID)
			if after.PoolState != tc.poolAfter || after.Status != string(lifecycle.Running) {
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
		in := e.pooled(store.PoolStateReady)
		if _, _, err := e.svc.Cordon(e.ctx, in.ID, "maintenance", "alice"); err != nil {
			t.Fatal(err)
		}
		e.clk.Advance(3600e9)
		got, state, err := e.svc.Uncordon(e.ctx, in.ID, "alice")
		if err != nil || state != instances.UncordonRestored || got.PoolState != store.PoolStateReady || got.Cordon != nil ||
			got.PoolReadyAt == nil || !got.PoolReadyAt.Equal(e.clk.Now()) {
			t.Fatalf("uncordon: %q %+v %v", state, got, err)
		}
		if !e.hasEvent(in.ID, events.InstanceUncordoned) {
			t.Fatal("no uncordoned event")
		}
	})
	t.Run("refuses a fenced member that is not running", func(t *testing.T) {
		e := newEnv(t)
		in := e.pooled(store.PoolStateReady)
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
		in := e.pooled(store.PoolStateReady)
		if _, _, err := e.svc.Cordon(e.ctx, in.ID, "maintenance", "alice"); err != nil {
			t.Fatal(err)
		}
		cur := e.get(in.ID)
		cur.PoolState = store.PoolStateErrored
		if err := e.st.UpdateInstance(e.ctx, cur); err != nil {
			t.Fatal(err)
		}
		got, state, err := e.svc.Uncordon(e.ctx, in.ID, "alice")
		if err != nil || state != instances.UncordonCleared || got.PoolState != store.PoolStateErrored || got.Cordon != nil {
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
		in := e.pooled(store.PoolStateReady)
		got, state, err := e.svc.Drain(e.ctx, in.ID, "retire", "alice")
		if err != nil || state != instances.CordonFenced || got.Status != string(lifecycle.Stopped) || got.PoolState != store.PoolStateDraining {
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
		if err != nil || state != instances.CordonAlreadyCordoned || got.Status != string(lifecycle.Stopped) || got.Cordon.Reason != "first" {
			t.Fatalf("drain: %q %+v %v", state, got, err)
		}
	})
	t.Run("a cordon refusal aborts before the stop", func(t *testing.T) {
		e := newEnv(t)
		in := e.pooled(store.PoolStateWarming)
		_, _, err := e.svc.Drain(e.ctx, in.ID, "retire", "alice")
		wantCode(t, err, codes.FailedPrecondition)
		if len(e.fake.CallsFor(fake.OpStop)) != 0 || e.get(in.ID).Status != string(lifecycle.Running) {
			t.Fatal("the stop ran after a refused cordon")
		}
	})
	t.Run("a failed stop is an error, with the cordon left in place", func(t *testing.T) {
		e := newEnv(t)
		in := e.running()
		e.fake.Inject(fake.OpStop, fake.Fault{Kind: providers.KindTransient})
		_, state, err := e.svc.Drain(e.ctx, in.ID, "retire", "alice")
		wantCode(t, err, codes.Unavailable)
		if state != instances.CordonNotPooled || e.get(in.ID).Cordon == nil || e.get(in.ID).Status != string(lifecycle.Running) {
			t.Fatalf("state %q, instance %+v", state, e.get(in.ID))
		}
	})
	t.Run("refused for the control plane's own host", func(t *testing.T) {
		e := newEnv(t)
		in := e.running()
		e.svc.SelfInstanceIDs = []string{in.ID}
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
	in := e.pooled(store.PoolStateClaimed)
	if _, err := e.svc.Terminate(e.ctx, in.ID); err != nil {
		t.Fatal(err)
	}
	if !e.hasEvent(in.ID, events.PoolReleased) || e.get(in.ID).PoolState == store.PoolStateClaimed {
		t.Fatalf("claim left open: %v", e.eventKinds(in.ID))
	}
}
