package servertest

import (
	"context"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/postgres"
	"github.com/tetherfleet/tether/internal/testkit/pgtest"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// pg is the server this test binary's tests share (fsync off); each test
// gets its own database. pgDurable, started only by the benchmarks, keeps
// fsync on, as SQLite's synchronous=FULL does.
var (
	pg        pgtest.Shared
	pgDurable = pgtest.Shared{Options: pgtest.Options{Durable: true}}
)

func TestMain(m *testing.M) {
	code := m.Run()
	pg.Close()
	pgDurable.Close()
	os.Exit(code)
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// twoReplicas starts two tetherd on one database and one data dir (so one
// CA and one blob store), as two processes behind a load balancer would
// share them.
func twoReplicas(t *testing.T, dsn string) (a, b *testcp.ControlPlane) {
	t.Helper()
	a = testcp.Start(t, testcp.WithStore(dsn))
	b = testcp.Start(t, testcp.WithStore(dsn), testcp.WithDataDir(a.DataDir))
	return a, b
}

// agent is a fake agent enrolled against one control plane, its Connect
// stream open.
type agent struct {
	instance string
	stream   grpc.BidiStreamingClient[v1.AgentMessage, v1.ControlMessage]
}

// enrollAgent provisions an external instance through admin, enrolls it
// against cp and opens its stream; it returns once the stream is
// registered (the Settings message comes after registration).
func enrollAgent(t *testing.T, ctx context.Context, admin, cp *testcp.ControlPlane, node string) agent {
	t.Helper()
	inst, token := admin.Provision(ctx, node)
	key := testcp.NewNodeKey(t)
	resp, err := v1.NewEnrollmentServiceClient(cp.Dial(nil)).Enroll(ctx, &v1.EnrollRequest{Token: token, CsrPem: key.CSRPEM})
	if err != nil {
		t.Fatalf("enroll: %v", err)
	}
	cert := key.Certificate(t, resp.CertificatePem)
	// The stream ends with the test, before the control planes stop
	// (cleanups run last first), so their graceful stop need not wait.
	sctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	stream, err := v1.NewAgentServiceClient(cp.Dial(&cert)).Connect(sctx)
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil || first.GetSettings() == nil {
		t.Fatalf("first message on the stream: %v, %v (want settings)", first, err)
	}
	return agent{instance: inst.Id, stream: stream}
}

// A task created through replica A reaches an agent connected to replica
// B through the notification, not B's 15 s safety poll.
func TestTaskCreatedOnAReachesAgentOnB(t *testing.T) {
	ctx := ctxT(t, 90*time.Second)
	a, b := twoReplicas(t, pg.DSN(t))
	fleet := a.SeedFleet(ctx, "edge")
	ag := enrollAgent(t, ctx, a, b, fleet.Node)

	start := time.Now()
	task, err := a.Admin.CreateTask(ctx, &v1.CreateTaskRequest{InstanceId: ag.instance, Kind: v1.TaskKind_TASK_KIND_EXEC,
		Exec: &v1.ExecPayload{Argv: []string{"true"}}})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *v1.TaskAssignment, 1)
	go func() {
		for {
			msg, err := ag.stream.Recv()
			if err != nil {
				close(got)
				return
			}
			if ta := msg.GetTask(); ta != nil {
				got <- ta
				return
			}
		}
	}()
	select {
	case ta, ok := <-got:
		if !ok {
			t.Fatal("B's stream ended before the task arrived")
		}
		if ta.TaskId != task.Id {
			t.Fatalf("B pushed task %s, want %s", ta.TaskId, task.Id)
		}
		t.Logf("task created on A reached the agent on B after %s", time.Since(start).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		t.Fatal("the task created on A did not reach the agent on B within 5s (streams do not poll: the notification was lost)")
	}
}

// A task whose notification never went out (written straight to the
// database, as a lost LISTEN connection would leave it) still reaches the
// agent on B: B's one sweep query finds it, with no per-stream poll.
func TestLostNotificationReachesAgentBySweep(t *testing.T) {
	ctx := ctxT(t, 90*time.Second)
	dsn := pg.DSN(t)
	a := testcp.Start(t, testcp.WithStore(dsn))
	b := testcp.Start(t, testcp.WithStore(dsn), testcp.WithDataDir(a.DataDir),
		testcp.With(func(o *daemon.ServeOptions) { o.Liveness.AgentSweep = 100 * time.Millisecond }))
	fleet := a.SeedFleet(ctx, "edge")
	ag := enrollAgent(t, ctx, a, b, fleet.Node)

	raw, err := postgres.Open(ctx, dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	now := time.Now()
	task := &store.Task{Target: store.TaskTargetAgent, InstanceID: store.InstanceID(ag.instance), Kind: "reboot", Payload: []byte(`{}`),
		Status: store.TaskPending, MaxAttempts: 1, CreatedAt: now, UpdatedAt: now}
	if err := raw.CreateTask(ctx, task); err != nil { // no Notify: the hint is lost
		t.Fatal(err)
	}
	for {
		msg, err := ag.stream.Recv()
		if err != nil {
			t.Fatalf("B's stream ended before the sweep delivered the task: %v", err)
		}
		if ta := msg.GetTask(); ta != nil {
			if ta.TaskId != task.ID.String() {
				t.Fatalf("B pushed task %s, want %s", ta.TaskId, task.ID)
			}
			return
		}
	}
}

// An event watch on B sees an event written through A.
func TestEventWatchOnBSeesWritesOnA(t *testing.T) {
	ctx := ctxT(t, 90*time.Second)
	a, b := twoReplicas(t, pg.DSN(t))
	fleet := a.SeedFleet(ctx, "edge")
	// Ended before the replicas stop, which would otherwise wait for it.
	wctx, endWatch := context.WithCancel(ctx)
	defer endWatch()
	watch, err := b.Admin.WatchEvents(wctx, &v1.WatchEventsRequest{Kind: "instance.provisioned"})
	if err != nil {
		t.Fatal(err)
	}
	evs := make(chan *v1.FleetEvent, 16)
	go func() {
		defer close(evs)
		for {
			ev, err := watch.Recv()
			if err != nil {
				return
			}
			evs <- ev
		}
	}()
	// The watch starts from the newest event when the server handles the
	// call, which the client cannot see. A probe provisioned through A
	// that comes through proves it has started; one written before the
	// start is never sent, so after a while (the watch polls every 2 s
	// besides its notifications) another probe goes.
	for probe := 1; ; probe++ {
		if probe > 5 {
			t.Fatal("B's event watch saw none of 5 provisionings done through A")
		}
		a.Provision(ctx, fleet.Node)
		select {
		case _, ok := <-evs:
			if !ok {
				t.Fatal("the watch ended")
			}
		case <-time.After(5 * time.Second):
			continue
		}
		break
	}
	start := time.Now()
	inst, _ := a.Provision(ctx, fleet.Node)
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-evs:
			if !ok {
				t.Fatal("the watch ended")
			}
			if ev.InstanceId != inst.Id {
				continue
			}
			t.Logf("event %s %s written on A seen on B after %s", ev.Id, ev.Kind, time.Since(start).Round(time.Millisecond))
			return
		case <-timeout:
			t.Fatal("B's event watch did not see the provisioning done through A")
		}
	}
}
