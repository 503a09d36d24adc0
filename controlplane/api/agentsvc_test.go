package api_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// enrolled provisions an external instance and enrolls it.
func enrolled(t *testing.T, cp *testcp.ControlPlane, node string) (*v1.Instance, tls.Certificate) {
	t.Helper()
	ctx := ctxT(t)
	inst, token := cp.Provision(ctx, node)
	key := testcp.NewNodeKey(t)
	resp, err := v1.NewEnrollmentServiceClient(cp.Dial(nil)).Enroll(ctx, &v1.EnrollRequest{Token: token, CsrPem: key.CSRPEM})
	if err != nil {
		t.Fatal(err)
	}
	return inst, key.Certificate(t, resp.CertificatePem)
}

func TestModulePushRefusals(t *testing.T) {
	cp := testcp.Start(t)
	ctx := ctxT(t)
	img := testcp.TinyErofs()
	blobDir := filepath.Join(cp.DataDir, "blobs", "sha256")
	countBlobs := func() int {
		es, _ := os.ReadDir(blobDir)
		return len(es)
	}

	tests := []struct {
		name string
		push func() error
		code codes.Code
	}{
		{"not erofs", func() error {
			_, err := testcp.PushModule(ctx, cp.Admin, "junk", "1", bytes.Repeat([]byte("x"), 8192))
			return err
		}, codes.InvalidArgument},
		{"declared digest differs", func() error {
			s, _ := cp.Admin.PushModule(ctx)
			s.Send(&v1.PushModuleRequest{Msg: &v1.PushModuleRequest_Header{Header: &v1.PushModuleHeader{Name: "m", Version: "1",
				Digest: testcp.Digest([]byte("something else")), Size: int64(len(img))}}})
			s.Send(&v1.PushModuleRequest{Msg: &v1.PushModuleRequest_Chunk{Chunk: img}})
			_, err := s.CloseAndRecv()
			return err
		}, codes.InvalidArgument},
		{"shorter than declared", func() error {
			s, _ := cp.Admin.PushModule(ctx)
			s.Send(&v1.PushModuleRequest{Msg: &v1.PushModuleRequest_Header{Header: &v1.PushModuleHeader{Name: "m", Version: "1", Size: int64(len(img)) + 10}}})
			s.Send(&v1.PushModuleRequest{Msg: &v1.PushModuleRequest_Chunk{Chunk: img}})
			_, err := s.CloseAndRecv()
			return err
		}, codes.InvalidArgument},
		{"chunk before header", func() error {
			s, _ := cp.Admin.PushModule(ctx)
			s.Send(&v1.PushModuleRequest{Msg: &v1.PushModuleRequest_Chunk{Chunk: img}})
			_, err := s.CloseAndRecv()
			return err
		}, codes.InvalidArgument},
		{"bad name", func() error {
			_, err := testcp.PushModule(ctx, cp.Admin, "Bad Name", "1", img)
			return err
		}, codes.InvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wantCode(t, tc.push(), tc.code)
			if n := countBlobs(); n != 0 {
				t.Fatalf("a refused push left %d blobs", n)
			}
			ms, err := cp.Admin.ListModules(ctx, &v1.ListModulesRequest{})
			if err != nil || len(ms.Modules) != 0 {
				t.Fatalf("a refused push became visible: %v %v", ms, err)
			}
		})
	}

	// A client that disappears mid-upload leaves nothing visible.
	cctx, cancel := context.WithCancel(ctx)
	s, _ := cp.Admin.PushModule(cctx)
	s.Send(&v1.PushModuleRequest{Msg: &v1.PushModuleRequest_Header{Header: &v1.PushModuleHeader{Name: "cut", Version: "1", Size: int64(len(img))}}})
	s.Send(&v1.PushModuleRequest{Msg: &v1.PushModuleRequest_Chunk{Chunk: img[:len(img)/2]}})
	// Cut the client once the upload is staging, not after a guessed delay.
	deadline := time.Now().Add(5 * time.Second)
	for {
		tmp, _ := os.ReadDir(filepath.Join(cp.DataDir, "blobs", "tmp"))
		if len(tmp) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the upload never started staging")
		}
		time.Sleep(5 * time.Millisecond) // polls tetherd's data directory
	}
	cancel()
	deadline = time.Now().Add(5 * time.Second)
	for {
		tmp, _ := os.ReadDir(filepath.Join(cp.DataDir, "blobs", "tmp"))
		if len(tmp) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a cut upload left %d staging files", len(tmp))
		}
		time.Sleep(20 * time.Millisecond) // polls tetherd's data directory
	}
	if _, err := cp.Admin.GetModule(ctx, &v1.GetModuleRequest{Name: "cut", Version: "1"}); status.Code(err) != codes.NotFound {
		t.Fatalf("a cut upload became visible: %v", err)
	}
	if n := countBlobs(); n != 0 {
		t.Fatalf("a cut upload left %d blobs", n)
	}
}

func TestFetchModule(t *testing.T) {
	cp := testcp.Start(t)
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "edge")
	// A module that is not assigned to the instance's template.
	secret := testcp.BuildErofs(fstest.MapFS{"secret": {Data: []byte("not yours")}})
	cp.PushModule(ctx, "secret", "1", secret)
	inst, cert := enrolled(t, cp, fleet.Node)
	agent := v1.NewAgentServiceClient(cp.Dial(&cert))

	as, err := agent.GetAssignment(ctx, &v1.GetAssignmentRequest{})
	if err != nil || len(as.RootModules) != 1 || as.InstanceId != inst.Id {
		t.Fatalf("assignment: %v %v", as, err)
	}
	want := testcp.TinyErofs()
	fetch := func(digest string, off int64) ([]byte, int64, error) {
		s, err := agent.FetchModule(ctx, &v1.FetchModuleRequest{Digest: digest, Offset: off})
		if err != nil {
			return nil, 0, err
		}
		var buf bytes.Buffer
		var size int64
		for {
			c, err := s.Recv()
			if err == io.EOF {
				return buf.Bytes(), size, nil
			}
			if err != nil {
				return nil, 0, err
			}
			if c.Size > 0 {
				size = c.Size
			}
			if c.Offset != off+int64(buf.Len()) {
				t.Fatalf("chunk at offset %d, want %d", c.Offset, off+int64(buf.Len()))
			}
			buf.Write(c.Data)
		}
	}
	got, size, err := fetch(as.RootModules[0].Digest, 0)
	if err != nil || !bytes.Equal(got, want) || size != int64(len(want)) {
		t.Fatalf("fetch: %d bytes (size %d), %v", len(got), size, err)
	}
	// Resume from an offset.
	tail, _, err := fetch(as.RootModules[0].Digest, 1000)
	if err != nil || !bytes.Equal(tail, want[1000:]) {
		t.Fatalf("resume from 1000: %d bytes, %v", len(tail), err)
	}
	_, _, err = fetch(testcp.Digest(secret), 0)
	wantCode(t, err, codes.PermissionDenied)
	_, _, err = fetch("sha256:nothex", 0)
	wantCode(t, err, codes.InvalidArgument)
	_, _, err = fetch(as.RootModules[0].Digest, int64(len(want))+1)
	wantCode(t, err, codes.InvalidArgument)
}

// connect opens a Connect stream and returns it after the settings message.
func connect(t *testing.T, ctx context.Context, cp *testcp.ControlPlane, cert tls.Certificate) (v1.AgentService_ConnectClient, *v1.Settings) {
	t.Helper()
	s, err := v1.NewAgentServiceClient(cp.Dial(&cert)).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if m.GetSettings() == nil {
		t.Fatalf("first message is %T, want settings", m.Msg)
	}
	return s, m.GetSettings()
}

func TestTaskPushLeaseAndResult(t *testing.T) {
	cp := testcp.Start(t)
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "edge")
	inst, cert := enrolled(t, cp, fleet.Node)
	stream, settings := connect(t, ctx, cp, cert)
	// One agent connected: its reconnection window is a few milliseconds.
	if settings.HeartbeatIntervalSeconds != 30 || settings.MaxTaskOutputBytes <= 0 || settings.ReconnectSpreadMs > 10 {
		t.Fatalf("settings %+v", settings)
	}
	if err := stream.Send(&v1.AgentMessage{Msg: &v1.AgentMessage_Heartbeat{Heartbeat: &v1.Heartbeat{Phase: v1.AgentPhase_AGENT_PHASE_READY, AgentVersion: "test"}}}); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, cp, inst.Id, v1.InstanceStatus_INSTANCE_STATUS_RUNNING)

	task, err := cp.Admin.CreateTask(ctx, &v1.CreateTaskRequest{InstanceId: inst.Id, Kind: v1.TaskKind_TASK_KIND_EXEC,
		Exec: &v1.ExecPayload{Argv: []string{"echo", "hi"}}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	a := m.GetTask()
	if a == nil || a.TaskId != task.Id || a.Exec == nil || a.Exec.Argv[0] != "echo" || a.LeaseExpiresAt == nil {
		t.Fatalf("pushed %+v", m)
	}
	send := func(u *v1.TaskUpdate) {
		if err := stream.Send(&v1.AgentMessage{Msg: &v1.AgentMessage_TaskUpdate{TaskUpdate: u}}); err != nil {
			t.Fatal(err)
		}
	}
	send(&v1.TaskUpdate{TaskId: task.Id, Status: v1.TaskStatus_TASK_STATUS_RUNNING, Progress: "started"})
	big := strings.Repeat("x", int(settings.MaxTaskOutputBytes)+100)
	send(&v1.TaskUpdate{TaskId: task.Id, Status: v1.TaskStatus_TASK_STATUS_SUCCEEDED, Result: &v1.TaskResult{ExitCode: 0, Output: []byte(big)}})
	got := waitTask(t, cp, task.Id, v1.TaskStatus_TASK_STATUS_SUCCEEDED)
	if len(got.Result.Output) != int(settings.MaxTaskOutputBytes) || !got.Result.OutputTruncated {
		t.Fatalf("output %d bytes, truncated %v: the server must cap oversized output", len(got.Result.Output), got.Result.OutputTruncated)
	}

	// A task of another instance: the update is refused and the stream ends.
	other, _ := enrolled(t, cp, fleet.Node)
	foreign, err := cp.Admin.CreateTask(ctx, &v1.CreateTaskRequest{InstanceId: other.Id, Kind: v1.TaskKind_TASK_KIND_REBOOT})
	if err != nil {
		t.Fatal(err)
	}
	send(&v1.TaskUpdate{TaskId: foreign.Id, Status: v1.TaskStatus_TASK_STATUS_SUCCEEDED})
	for {
		_, err := stream.Recv()
		if err != nil {
			wantCode(t, err, codes.PermissionDenied)
			break
		}
	}
	if ft := waitTask(t, cp, foreign.Id, v1.TaskStatus_TASK_STATUS_PENDING); ft.Status != v1.TaskStatus_TASK_STATUS_PENDING {
		t.Fatal("another instance's task was changed")
	}
}

func TestTaskLeaseExpiryAndCancel(t *testing.T) {
	clk := clock.NewFake(time.Now())
	cp := testcp.Start(t, testcp.WithClock(clk))
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "edge")
	inst, cert := enrolled(t, cp, fleet.Node)

	// Cancel before anyone leases it: cancelled at once.
	t1, err := cp.Admin.CreateTask(ctx, &v1.CreateTaskRequest{InstanceId: inst.Id, Kind: v1.TaskKind_TASK_KIND_MODULE_SYNC})
	if err != nil {
		t.Fatal(err)
	}
	if c, err := cp.Admin.CancelTask(ctx, &v1.CancelTaskRequest{Id: t1.Id}); err != nil || c.Status != v1.TaskStatus_TASK_STATUS_CANCELLED {
		t.Fatalf("cancel pending: %v %v", c, err)
	}
	if _, err := cp.Admin.CancelTask(ctx, &v1.CancelTaskRequest{Id: t1.Id}); err != nil {
		t.Fatalf("cancelling a cancelled task is a no-op: %v", err)
	}

	// A lease the agent never renews returns the task to pending with attempts+1.
	t2, err := cp.Admin.CreateTask(ctx, &v1.CreateTaskRequest{InstanceId: inst.Id, Kind: v1.TaskKind_TASK_KIND_EXEC,
		Exec: &v1.ExecPayload{Argv: []string{"sleep", "1000"}}, MaxAttempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	stream, _ := connect(t, sctx, cp, cert)
	if m, err := stream.Recv(); err != nil || m.GetTask().GetTaskId() != t2.Id {
		t.Fatalf("push: %v %v", m, err)
	}
	stop() // the agent goes away without a word
	clk.Advance(2 * time.Minute)
	got := waitTask(t, cp, t2.Id, v1.TaskStatus_TASK_STATUS_PENDING)
	if got.Attempts != 1 {
		t.Fatalf("attempts %d, want 1", got.Attempts)
	}

	// Reconnect: the task comes again; cancelling it while running tells the agent.
	stream, _ = connect(t, ctx, cp, cert)
	if m, err := stream.Recv(); err != nil || m.GetTask().GetTaskId() != t2.Id {
		t.Fatalf("re-push: %v %v", m, err)
	}
	stream.Send(&v1.AgentMessage{Msg: &v1.AgentMessage_TaskUpdate{TaskUpdate: &v1.TaskUpdate{TaskId: t2.Id, Status: v1.TaskStatus_TASK_STATUS_RUNNING}}})
	waitTask(t, cp, t2.Id, v1.TaskStatus_TASK_STATUS_RUNNING)
	if _, err := cp.Admin.CancelTask(ctx, &v1.CancelTaskRequest{Id: t2.Id}); err != nil {
		t.Fatal(err)
	}
	m, err := stream.Recv()
	if err != nil || m.GetCancel().GetTaskId() != t2.Id {
		t.Fatalf("cancel not relayed: %v %v", m, err)
	}
	stream.Send(&v1.AgentMessage{Msg: &v1.AgentMessage_TaskUpdate{TaskUpdate: &v1.TaskUpdate{TaskId: t2.Id, Status: v1.TaskStatus_TASK_STATUS_CANCELLED}}})
	waitTask(t, cp, t2.Id, v1.TaskStatus_TASK_STATUS_CANCELLED)

	// Past max_attempts a lapsed lease fails the task with a reason.
	t3, _ := cp.Admin.CreateTask(ctx, &v1.CreateTaskRequest{InstanceId: inst.Id, Kind: v1.TaskKind_TASK_KIND_POWEROFF, MaxAttempts: 1})
	if m, err := stream.Recv(); err != nil || m.GetTask().GetTaskId() != t3.Id {
		t.Fatalf("push: %v %v", m, err)
	}
	clk.Advance(2 * time.Minute)
	failed := waitTask(t, cp, t3.Id, v1.TaskStatus_TASK_STATUS_FAILED)
	if !strings.Contains(failed.ErrorMessage, "lease expired") {
		t.Fatalf("failed without a reason: %q", failed.ErrorMessage)
	}
}

func waitStatus(t *testing.T, cp *testcp.ControlPlane, id string, want v1.InstanceStatus) *v1.Instance {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		in, err := cp.Admin.GetInstance(context.Background(), &v1.GetInstanceRequest{Id: id})
		if err == nil && in.Status == want {
			return in
		}
		if time.Now().After(deadline) {
			t.Fatalf("instance %s: %v (%v), want %v", id, in.GetStatus(), err, want)
		}
		time.Sleep(20 * time.Millisecond) // polls a running tetherd over its API
	}
}

func waitTask(t *testing.T, cp *testcp.ControlPlane, id string, want v1.TaskStatus) *v1.Task {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		tk, err := cp.Admin.GetTask(context.Background(), &v1.GetTaskRequest{Id: id})
		if err == nil && tk.Status == want {
			return tk
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s: %v (%v), want %v", id, tk.GetStatus(), err, want)
		}
		time.Sleep(20 * time.Millisecond) // polls a running tetherd over its API
	}
}

// Through tetherd: a heartbeat with an escape sequence in an address ends
// the stream with InvalidArgument naming the field, and none of it shows
// on the instance; the next good heartbeat is stored as usual.
func TestHostileHeartbeatIsRefusedOverTheWire(t *testing.T) {
	cp := testcp.Start(t)
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "hb")
	in, cert := enrolled(t, cp, fleet.Node)
	s, _ := connect(t, ctx, cp, cert)
	if err := s.Send(&v1.AgentMessage{Msg: &v1.AgentMessage_Heartbeat{Heartbeat: &v1.Heartbeat{
		Phase: v1.AgentPhase_AGENT_PHASE_MOUNTING, AgentVersion: "evil", Addresses: []string{"10.0.2.15\x1b]0;pwned\x07"}}}}); err != nil {
		t.Fatal(err)
	}
	var err error
	for err == nil {
		_, err = s.Recv()
	}
	wantCode(t, err, codes.InvalidArgument)
	if msg := status.Convert(err).Message(); !strings.HasPrefix(msg, "heartbeat.addresses[0]: ") || strings.Contains(msg, "\x1b") {
		t.Fatalf("refusal %q", msg)
	}
	s, _ = connect(t, ctx, cp, cert)
	if err := s.Send(&v1.AgentMessage{Msg: &v1.AgentMessage_Heartbeat{Heartbeat: &v1.Heartbeat{
		Phase: v1.AgentPhase_AGENT_PHASE_MOUNTING, AgentVersion: "good", Addresses: []string{"10.0.2.15"}}}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: in.Id})
		if err != nil {
			t.Fatal(err)
		}
		if got.AgentVersion == "evil" {
			t.Fatalf("the refused heartbeat was stored: %v", got)
		}
		if got.AgentVersion == "good" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the good heartbeat never showed: %v", got)
		}
		time.Sleep(20 * time.Millisecond) // polls the hub's flush in a running tetherd
	}
}
