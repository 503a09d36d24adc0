package api_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// The stream's handler is its receive loop; what ends it from outside
// (a newer stream, a revocation) goes through its end hook. Each must end
// exactly the stream it concerns, with the reason, and leave the other
// streams working.
func TestConnectIsEndedFromOutside(t *testing.T) {
	cp := testcp.Start(t)
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "edge")
	inst, cert := enrolled(t, cp, fleet.Node)
	bystander, bcert := enrolled(t, cp, fleet.Node)
	other, _ := connect(t, ctx, cp, bcert)

	// A newer stream from the same instance replaces the old one.
	old, _ := connect(t, ctx, cp, cert)
	newer, _ := connect(t, ctx, cp, cert)
	_, err := old.Recv()
	wantCode(t, err, codes.Unavailable)
	if !strings.Contains(status.Convert(err).Message(), "newer stream") {
		t.Fatalf("the old stream ended with %v; want it to say a newer stream replaced it", err)
	}
	task, err := cp.Admin.CreateTask(ctx, &v1.CreateTaskRequest{InstanceId: inst.Id, Kind: v1.TaskKind_TASK_KIND_REBOOT})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := newer.Recv(); err != nil || m.GetTask().GetTaskId() != task.Id {
		t.Fatalf("the newer stream got %v, %v; want task %s pushed to it", m, err, task.Id)
	}

	// A revocation ends the streams of that certificate, at once.
	if _, err := cp.Admin.RevokeCertificate(ctx, &v1.RevokeCertificateRequest{Serial: cert.Leaf.SerialNumber.Text(16), Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	_, err = newer.Recv()
	wantCode(t, err, codes.Unauthenticated)
	if !strings.Contains(status.Convert(err).Message(), "revoked") {
		t.Fatalf("the revoked stream ended with %v; want it to say so", err)
	}

	// The bystander's stream still gets its work.
	btask, err := cp.Admin.CreateTask(ctx, &v1.CreateTaskRequest{InstanceId: bystander.Id, Kind: v1.TaskKind_TASK_KIND_REBOOT})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := other.Recv(); err != nil || m.GetTask().GetTaskId() != btask.Id {
		t.Fatalf("the bystander got %v, %v; want task %s", m, err, btask.Id)
	}
}
