package api_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// failRunning fails the first transaction that records an instance as
// running, as a lost deadlock or a database blip would.
type failRunning struct {
	store.Store
	failed chan struct{}
	n      atomic.Int32
}

func (f *failRunning) Tx(ctx context.Context, fn func(q store.Queries) error) error {
	return f.Store.Tx(ctx, func(q store.Queries) error { return fn(failRunningQ{q, f}) })
}

type failRunningQ struct {
	store.Queries
	f *failRunning
}

func (q failRunningQ) AppendEvent(ctx context.Context, e *store.Event) error {
	if e.Kind == "instance.running" && q.f.n.Add(1) == 1 {
		defer close(q.f.failed)
		return errors.New("injected: the store lost this write")
	}
	return q.Queries.AppendEvent(ctx, e)
}

// A ready heartbeat whose "mark running" write fails is not forgotten: the
// agent's next ready heartbeat marks the instance running.
func TestFailedMarkRunningIsRetriedByTheNextReadyHeartbeat(t *testing.T) {
	fr := &failRunning{failed: make(chan struct{})}
	cp := testcp.Start(t, testcp.With(func(o *daemon.ServeOptions) {
		o.Test.WrapStore = func(s store.Store) store.Store { fr.Store = s; return fr }
	}))
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "edge")
	inst, cert := enrolled(t, cp, fleet.Node)
	stream, _ := connect(t, ctx, cp, cert)
	ready := func() {
		t.Helper()
		if err := stream.Send(&v1.AgentMessage{Msg: &v1.AgentMessage_Heartbeat{Heartbeat: &v1.Heartbeat{Phase: v1.AgentPhase_AGENT_PHASE_READY, AgentVersion: "test"}}}); err != nil {
			t.Fatal(err)
		}
	}
	ready()
	select {
	case <-fr.failed:
	case <-ctx.Done():
		t.Fatal("the first ready heartbeat did not try to mark the instance running")
	}
	ready()
	waitStatus(t, cp, inst.Id, v1.InstanceStatus_INSTANCE_STATUS_RUNNING)
}
