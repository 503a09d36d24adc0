package api_test

import (
	"context"
	"slices"
	"testing"

	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	"github.com/tetherfleet/tether/internal/testkit/testcp"
)

// The README promises that grpcurl works against tetherd: it lists the
// services through server reflection and resolves their methods from it.
// This asks what grpcurl asks, with an admin certificate.
func TestTheAPIIsReflected(t *testing.T) {
	cp := testcp.Start(t)
	conn := cp.Dial(&cp.AdminCert)
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ask := func(req *reflectionpb.ServerReflectionRequest) *reflectionpb.ServerReflectionResponse {
		t.Helper()
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if e := resp.GetErrorResponse(); e != nil {
			t.Fatalf("reflection refused %v: %s", req.MessageRequest, e.ErrorMessage)
		}
		return resp
	}
	var names []string
	for _, s := range ask(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}).GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	for _, want := range []string{"tether.v1.AdminService", "tether.v1.AgentService", "tether.v1.EnrollmentService"} {
		if !slices.Contains(names, want) {
			t.Errorf("reflection lists %v; %s is missing", names, want)
		}
	}
	files := ask(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{
		FileContainingSymbol: "tether.v1.AdminService.ListInstances"}}).GetFileDescriptorResponse().GetFileDescriptorProto()
	if len(files) == 0 {
		t.Fatal("no file descriptor for tether.v1.AdminService.ListInstances: grpcurl could not call it")
	}
}
