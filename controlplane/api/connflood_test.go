package api_test

import (
	"net"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// A flood of idle TCP connections from one address (no TLS handshake, as
// anyone who reaches the port can send) neither starves enrolled agents
// nor the store: past the per-source cap they are closed at accept time,
// and the ones admitted are cut at the handshake deadline.
func TestIdleConnectionFloodLeavesAgentsWorking(t *testing.T) {
	const flood, perSource = 300, 16
	cp := testcp.Start(t, testcp.With(func(o *daemon.ServeOptions) {
		o.Limits.MaxUnauthenticatedPerSource = perSource
		o.Limits.HandshakeTimeout = time.Second
	}))
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "edge")
	inst, cert := enrolled(t, cp, fleet.Node)
	stream, _ := connect(t, ctx, cp, cert)

	// The flood comes from 127.0.0.2; the agent and the admin from 127.0.0.1.
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Timeout: 5 * time.Second}
	conns := make([]net.Conn, 0, flood)
	for i := 0; i < flood; i++ {
		c, err := d.DialContext(ctx, "tcp", cp.Addr)
		if err != nil {
			t.Fatalf("flood connection %d: %v", i, err)
		}
		defer c.Close()
		conns = append(conns, c)
	}

	// The enrolled agent keeps working: its heartbeat is written to the
	// store, a task reaches its stream, and a new agent still enrolls.
	if err := stream.Send(&v1.AgentMessage{Msg: &v1.AgentMessage_Heartbeat{Heartbeat: &v1.Heartbeat{Phase: v1.AgentPhase_AGENT_PHASE_READY, AgentVersion: "test"}}}); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, cp, inst.Id, v1.InstanceStatus_INSTANCE_STATUS_RUNNING)
	task, err := cp.Admin.CreateTask(ctx, &v1.CreateTaskRequest{InstanceId: inst.Id, Kind: v1.TaskKind_TASK_KIND_REBOOT})
	if err != nil {
		t.Fatalf("create a task during the flood: %v", err)
	}
	if m, err := stream.Recv(); err != nil || m.GetTask().GetTaskId() != task.Id {
		t.Fatalf("task during the flood: %v, %v", m, err)
	}
	enrolled(t, cp, fleet.Node)

	// Every flood connection is closed by the server: at once past the
	// cap, at the handshake deadline within it. None is held for gRPC's
	// default 120 s.
	held := 0
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatal("the server sent bytes to a connection that never started TLS")
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			held++
		}
	}
	if held > 0 {
		t.Fatalf("%d of %d idle connections still held 10 s later (handshake deadline 1 s)", held, flood)
	}
}
