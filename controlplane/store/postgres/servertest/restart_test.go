package servertest

import (
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/internal/apierr"
	"github.com/tetherfleet/tether/internal/testkit/logbuf"
	"github.com/tetherfleet/tether/internal/testkit/pgtest"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// A PostgreSQL restart while tetherd serves: admin calls during the outage
// fail with Unavailable and say why, tetherd recovers without a restart of
// its own, every call acknowledged before, during or after is kept, and a
// heartbeat that arrived during the outage is written once the database
// is back.
func TestPostgresRestartThroughTheAPI(t *testing.T) {
	srv := pgtest.StartServer(t, pgtest.Options{})
	dsn := pgtest.NewDatabase(t, srv)
	ctx := ctxT(t, 120*time.Second)
	var logs syncBuffer
	cp := testcp.Start(t, testcp.WithStore(dsn), testcp.WithLog(slog.New(slog.NewTextHandler(&logs, nil))))
	fleet := cp.SeedFleet(ctx, "edge")
	ag := enrollAgent(t, ctx, cp, cp, fleet.Node)

	var (
		mu          sync.Mutex
		acked       []string
		unavailable []string
		okAfter     atomic.Int64
		restarted   atomic.Bool
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				task, err := cp.Admin.CreateTask(ctx, &v1.CreateTaskRequest{InstanceId: ag.instance, Kind: v1.TaskKind_TASK_KIND_EXEC,
					Exec: &v1.ExecPayload{Argv: []string{"true"}}})
				mu.Lock()
				switch status.Code(err) {
				case codes.OK:
					acked = append(acked, task.Id)
					if restarted.Load() {
						okAfter.Add(1)
					}
				case codes.Unavailable:
					unavailable = append(unavailable, status.Convert(err).Message())
				default:
					t.Errorf("writer %d: during an outage calls must fail with Unavailable, got %v", w, err)
				}
				mu.Unlock()
				if err != nil {
					time.Sleep(20 * time.Millisecond) // writers retry against a restarting PostgreSQL
				}
			}
		}(w)
	}
	// The agent's tasks pile up on its stream; read them off so the
	// server never blocks on a full stream window.
	go func() {
		for {
			if _, err := ag.stream.Recv(); err != nil {
				return
			}
		}
	}()

	time.Sleep(500 * time.Millisecond) // let the writers run against PostgreSQL before stopping it
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	// A heartbeat during the outage: the hub keeps it in memory and its
	// flushes fail until the database is back.
	if err := ag.stream.Send(&v1.AgentMessage{Msg: &v1.AgentMessage_Heartbeat{Heartbeat: &v1.Heartbeat{
		Phase: v1.AgentPhase_AGENT_PHASE_PULLING, AgentVersion: "v-during-outage", BootId: "boot-1"}}}); err != nil {
		t.Fatal(err)
	}
	_, err := cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: ag.instance})
	if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), "database is unavailable") {
		t.Fatalf("a read during the outage: got %v, want Unavailable saying the database is unavailable", err)
	}
	// Clients (tetherctl) recognise the outage by this reason, not the words.
	if got := apierr.Reason(err); got != apierr.DatabaseUnavailable {
		t.Fatalf("a read during the outage carries reason %q, want %q", got, apierr.DatabaseUnavailable)
	}
	t.Logf("during the outage: %v", err)
	time.Sleep(1500 * time.Millisecond) // several failed heartbeat flushes (every 50 ms in testcp)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	restarted.Store(true)
	restartedAt := time.Now()
	for okAfter.Load() < 20 {
		if time.Since(restartedAt) > 30*time.Second {
			t.Fatalf("tetherd did not recover within 30s of the restart (%d successes)", okAfter.Load())
		}
		time.Sleep(10 * time.Millisecond) // polls tetherd recovering after PostgreSQL restarts
	}
	t.Logf("tetherd recovered %s after the restart", time.Since(restartedAt).Round(time.Millisecond))
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	if len(unavailable) == 0 {
		t.Fatal("no call failed during the outage")
	}
	for _, id := range acked {
		if _, err := cp.Admin.GetTask(ctx, &v1.GetTaskRequest{Id: id}); err != nil {
			t.Fatalf("task %s was acknowledged before/during/after the restart but is gone: %v", id, err)
		}
	}
	t.Logf("%d CreateTask calls acknowledged and kept, %d refused as Unavailable", len(acked), len(unavailable))

	deadline := time.Now().Add(10 * time.Second)
	for {
		in, err := cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: ag.instance})
		if err == nil && in.AgentVersion == "v-during-outage" && in.AgentPhase == v1.AgentPhase_AGENT_PHASE_PULLING && in.LastHeartbeatAt != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the heartbeat buffered during the outage was not written after it: %v %v", in, err)
		}
		time.Sleep(50 * time.Millisecond) // polls tetherd writing the buffered heartbeat to PostgreSQL
	}
	// ...and it was the hub's retry that wrote it, not a lucky first flush.
	if !strings.Contains(logs.String(), "heartbeat batch not written; keeping it for the next flush") {
		t.Fatal("no failed heartbeat flush was logged during the outage")
	}
}

// syncBuffer is a log sink the test reads while tetherd writes.
type syncBuffer = logbuf.Buffer
