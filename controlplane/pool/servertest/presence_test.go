package servertest

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/postgres"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// crashable is a replica's store that can stop answering the presence
// writes, as a replica killed with -9 does: its streams' presence is
// neither closed nor renewed again.
type crashable struct {
	store.Store
	dead atomic.Bool
}

var errCrashed = errors.New("replica crashed")

func (c *crashable) ClosePresence(ctx context.Context, id store.InstanceID, stream string, at time.Time) (bool, error) {
	if c.dead.Load() {
		return false, errCrashed
	}
	return c.Store.ClosePresence(ctx, id, stream, at)
}

func (c *crashable) RenewPresence(ctx context.Context, replica string, until time.Time) (int64, error) {
	if c.dead.Load() {
		return 0, errCrashed
	}
	return c.Store.RenewPresence(ctx, replica, until)
}

// connectAgent enrolls an external instance's agent and holds its stream
// on cp until ctx ends, after reporting ready.
func connectAgent(t *testing.T, ctx context.Context, cp *testcp.ControlPlane, token string) v1.AgentService_ConnectClient {
	t.Helper()
	key := testcp.NewNodeKey(t)
	resp, err := v1.NewEnrollmentServiceClient(cp.Dial(nil)).Enroll(ctx, &v1.EnrollRequest{Token: token, CsrPem: key.CSRPEM})
	if err != nil {
		t.Fatal(err)
	}
	cert := key.Certificate(t, resp.CertificatePem)
	s, err := v1.NewAgentServiceClient(cp.Dial(&cert)).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&v1.AgentMessage{Msg: &v1.AgentMessage_Heartbeat{Heartbeat: &v1.Heartbeat{Phase: v1.AgentPhase_AGENT_PHASE_READY, AgentVersion: "test"}}}); err != nil {
		t.Fatal(err)
	}
	return s
}

// Two replicas on one database; the replica holding a ready member's
// agent stream is killed. The other replica hands the member out only
// while the dead replica's lease stands, refuses it (saying why) once the
// lease ran out, and hands it out again after the agent reconnects to it.
func TestMemberOfAKilledReplicaIsNotClaimed(t *testing.T) {
	dsn := pg.DSN(t)
	lease := 2 * time.Second
	crashA := &crashable{}
	a := testcp.Start(t, testcp.WithStore(dsn), testcp.With(func(o *daemon.ServeOptions) {
		o.Liveness.PresenceLease = lease
		o.Test.WrapStore = func(s store.Store) store.Store { crashA.Store = s; return crashA }
	}))
	b := testcp.Start(t, testcp.WithStore(dsn), testcp.WithDataDir(a.DataDir), testcp.With(func(o *daemon.ServeOptions) { o.Liveness.PresenceLease = lease }))
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	st, err := postgres.Open(ctx, dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	fleet := a.SeedFleet(ctx, "crash")
	p, err := b.Admin.CreatePool(ctx, &v1.CreatePoolRequest{Name: "crash", Template: fleet.Template, Provider: "qemu"})
	if err != nil {
		t.Fatal(err)
	}
	in, token := a.Provision(ctx, fleet.Node)
	actx, dropA := context.WithCancel(ctx)
	connectAgent(t, actx, a, token)
	// The member's row: running and ready in the pool (what warming does).
	deadline := time.Now().Add(15 * time.Second)
	for {
		row, err := st.GetInstance(ctx, store.InstanceID(in.Id))
		if err != nil {
			t.Fatal(err)
		}
		if row.Status == lifecycle.Running {
			now := time.Now()
			row.PoolID, row.PoolState, row.PoolWarmingStartedAt, row.PoolReadyAt = store.PoolID(p.Id), lifecycle.PoolReady, &now, &now
			if err := st.UpdateInstance(ctx, row); err != nil {
				t.Fatal(err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("instance %s never ran (%s)", in.Id, row.Status)
		}
		time.Sleep(50 * time.Millisecond) // polling a row another process moves
	}
	ps, err := st.ListPresence(ctx, []store.InstanceID{store.InstanceID(in.Id)})
	if err != nil || !ps[store.InstanceID(in.Id)].Live(time.Now()) {
		t.Fatalf("the agent's stream on replica a left no live presence: %+v %v", ps[store.InstanceID(in.Id)], err)
	}

	// Kill replica a: nothing it held is closed or renewed again.
	crashA.dead.Store(true)
	killed := time.Now()
	a.Stop()
	dropA()
	// Past the lease, replica b must refuse, naming why.
	time.Sleep(time.Until(killed.Add(lease + 500*time.Millisecond))) // the lease is wall-clock time in the store
	_, err = b.Admin.AcquirePoolMember(ctx, &v1.AcquirePoolMemberRequest{PoolName: "crash", AcquiredBy: "after-crash"})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "without a connected agent") {
		t.Fatalf("acquire after the holding replica died = %v; want ResourceExhausted naming the absent agent", err)
	}
	row, err := st.GetInstance(ctx, store.InstanceID(in.Id))
	if err != nil || row.PoolState != lifecycle.PoolReady {
		t.Fatalf("the member must stay ready and unclaimed: %v %v", row.PoolState, err)
	}

	// The agent moves to replica b: claimable again. A fresh enrollment
	// needs a fresh token; the member's identity is the instance id.
	tok, err := b.Admin.CreateBootstrapToken(ctx, &v1.CreateBootstrapTokenRequest{InstanceId: in.Id, TtlSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	connectAgent(t, ctx, b, tok.Token)
	deadline = time.Now().Add(15 * time.Second)
	for {
		r, err := b.Admin.AcquirePoolMember(ctx, &v1.AcquirePoolMemberRequest{PoolName: "crash", AcquiredBy: "after-reconnect"})
		if err == nil {
			if r.Instance.Id != in.Id {
				t.Fatalf("claimed %s, want %s", r.Instance.Id, in.Id)
			}
			got, err := b.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: in.Id})
			if err != nil || !got.GetAgentPresence().GetConnected() || got.AgentPresence.Replica == ps[store.InstanceID(in.Id)].Replica {
				t.Fatalf("presence after the move: %+v (%v); want connected to replica b, not %s", got.GetAgentPresence(), err, ps[store.InstanceID(in.Id)].Replica)
			}
			return
		}
		if status.Code(err) != codes.ResourceExhausted || time.Now().After(deadline) {
			t.Fatalf("acquire after the agent reconnected: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
