// Package e2e holds the end-to-end tests: an in-process fleet (real
// tetherd, real TLS on loopback, real agents in --root-mode=none) and, in
// vm_test.go, real VMs booted through the qemu provider.
package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/internal/testkit/logbuf"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// syncBuffer is a console several goroutines write to.
type syncBuffer = logbuf.Buffer

// startAgent runs a real agent in root mode none against cp.
func startAgent(t *testing.T, ctx context.Context, cp *testcp.ControlPlane, token string) (*syncBuffer, <-chan error) {
	t.Helper()
	console := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- agent.Run(ctx, agent.Config{
			ControlPlane: "https://" + cp.Addr, Token: token, CASHA256: cp.Fingerprint(),
			StateDir: t.TempDir(), RootMode: agent.RootModeNone, Console: console,
			Version: "e2e",
		})
	}()
	return console, done
}

// TestInProcessFleet: several agents enroll over real TLS, fetch and
// verify their modules, go running, run an exec task and report its
// output.
func TestInProcessFleet(t *testing.T) {
	cp := testcp.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fleet := cp.SeedFleet(ctx, "edge")

	const agents = 4
	type member struct {
		id      string
		console *syncBuffer
		done    <-chan error
	}
	var ms []member
	for i := 0; i < agents; i++ {
		inst, token := cp.Provision(ctx, fleet.Node)
		console, done := startAgent(t, ctx, cp, token)
		ms = append(ms, member{inst.Id, console, done})
	}
	for _, m := range ms {
		in := waitFor(t, ctx, cp, m.id, func(in *v1.Instance) bool {
			return in.Status == v1.InstanceStatus_INSTANCE_STATUS_RUNNING && len(in.RunningModuleDigests) == 1
		})
		if in.AgentPhase != v1.AgentPhase_AGENT_PHASE_READY || in.AgentVersion != "e2e" {
			t.Fatalf("instance %s: phase %v version %q", m.id, in.AgentPhase, in.AgentVersion)
		}
	}
	for _, m := range ms {
		task, err := cp.Admin.CreateTask(ctx, &v1.CreateTaskRequest{InstanceId: m.id, Kind: v1.TaskKind_TASK_KIND_EXEC,
			Exec: &v1.ExecPayload{Argv: []string{"sh", "-c", "echo hello from $0", m.id}}})
		if err != nil {
			t.Fatal(err)
		}
		got := waitTask(t, ctx, cp, task.Id)
		if got.Status != v1.TaskStatus_TASK_STATUS_SUCCEEDED || got.Result == nil ||
			strings.TrimSpace(string(got.Result.Output)) != "hello from "+m.id {
			t.Fatalf("exec on %s: %v %q %q", m.id, got.Status, got.ErrorMessage, got.GetResult().GetOutput())
		}
	}
	for _, m := range ms {
		for _, phase := range []string{"phase enrolling", "phase pulling", "phase ready"} {
			if !strings.Contains(m.console.String(), phase) {
				t.Errorf("agent %s console lacks %q:\n%s", m.id, phase, m.console.String())
			}
		}
	}
	cancel()
	for _, m := range ms {
		select {
		case err := <-m.done:
			if err != nil {
				t.Errorf("agent %s: %v", m.id, err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("agent %s did not stop", m.id)
		}
	}
}

// TestTamperedModuleIsRefused: the blob on the control plane's disk is
// corrupted; the agent refuses it, reports the mismatch, and the instance
// shows the reason.
func TestTamperedModuleIsRefused(t *testing.T) {
	cp := testcp.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fleet := cp.SeedFleet(ctx, "edge")
	tpl, err := cp.Admin.GetTemplate(ctx, &v1.GetTemplateRequest{Name: fleet.Template})
	if err != nil {
		t.Fatal(err)
	}
	corruptBlob(t, cp.DataDir, tpl.RootModules[0].Digest)
	inst, token := cp.Provision(ctx, fleet.Node)
	_, done := startAgent(t, ctx, cp, token)
	in := waitFor(t, ctx, cp, inst.Id, func(in *v1.Instance) bool { return strings.Contains(in.AgentError, "mismatch") })
	if in.Status == v1.InstanceStatus_INSTANCE_STATUS_RUNNING || !strings.Contains(in.AgentError, tpl.RootModules[0].Digest) {
		t.Fatalf("instance %v, agent error %q", in.Status, in.AgentError)
	}
	evs, err := cp.Admin.ListEvents(ctx, &v1.ListEventsRequest{InstanceId: inst.Id, Kind: "instance.agent_error"})
	if err != nil || len(evs.Events) == 0 {
		t.Fatalf("no instance.agent_error event: %v", err)
	}
	// The agent gives up on this boot and says why (as PID 1, Supervise
	// prints it on the console as "FAILED: ..." and retries).
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "mismatch") || !strings.Contains(err.Error(), "re-push") {
			t.Fatalf("the agent's error must name the mismatch and what to do: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the agent kept going with a tampered module")
	}
}

func waitFor(t *testing.T, ctx context.Context, cp *testcp.ControlPlane, id string, ok func(*v1.Instance) bool) *v1.Instance {
	t.Helper()
	var last *v1.Instance
	for ctx.Err() == nil {
		in, err := cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: id})
		if err == nil {
			last = in
			if ok(in) {
				return in
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("instance %s never reached the expected state; last: %v", id, last)
	return nil
}

func waitTask(t *testing.T, ctx context.Context, cp *testcp.ControlPlane, id string) *v1.Task {
	t.Helper()
	for ctx.Err() == nil {
		tk, err := cp.Admin.GetTask(ctx, &v1.GetTaskRequest{Id: id})
		if err == nil && (tk.Status == v1.TaskStatus_TASK_STATUS_SUCCEEDED || tk.Status == v1.TaskStatus_TASK_STATUS_FAILED || tk.Status == v1.TaskStatus_TASK_STATUS_CANCELLED) {
			return tk
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("task %s did not finish", id)
	return nil
}
