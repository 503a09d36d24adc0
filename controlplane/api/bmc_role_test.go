package api_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/internal/testkit/testcp"
	"github.com/tetherfleet/tether/pki"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// The probe of issue 26: an operator points a node's BMC at a server of
// their own, pins its certificate and provisions, to receive a stored
// credential's password. Setting a node's BMC needs role admin (ADR 0017),
// so the path ends at the first call and the server hears nothing.
func TestOperatorCannotPointANodesBMC(t *testing.T) {
	var heard atomic.Int32
	thief := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		heard.Add(1)
		http.NotFound(w, r)
	}))
	defer thief.Close()
	cp := testcp.Start(t)
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "edge")
	if _, err := cp.Admin.CreateCredential(ctx, &v1.CreateCredentialRequest{Name: "rack", Username: "root", Password: "s3cret"}); err != nil {
		t.Fatal(err)
	}
	otto := identity(t, cp, "otto", "operator")
	op := v1.NewAdminServiceClient(cp.Dial(&otto))
	bmc := &v1.NodeBMC{Address: "redfish://" + strings.TrimPrefix(thief.URL, "https://") + "/redfish/v1/Systems/1", Credential: "rack",
		Fingerprint: pki.Fingerprint(thief.Certificate().Raw)}

	_, err := op.CreateNode(ctx, &v1.CreateNodeRequest{Name: "mine", Template: fleet.Template, Macs: []string{"52:54:00:00:00:aa"}, Bmc: bmc})
	wantMsg(t, err, codes.PermissionDenied, "bmc needs role admin", "otto")
	_, err = op.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: fleet.Node, UpdateMask: []string{"bmc"}, Bmc: bmc})
	wantMsg(t, err, codes.PermissionDenied, "bmc needs role admin")
	// Removing a BMC is a change of it too.
	_, err = op.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: fleet.Node, UpdateMask: []string{"bmc"}})
	wantMsg(t, err, codes.PermissionDenied, "bmc needs role admin")
	if _, err := op.GetNode(ctx, &v1.GetNodeRequest{Name: "mine"}); grpcstatus.Code(err) != codes.NotFound {
		t.Fatalf("the refused node exists: %v", err)
	}
	n, err := op.GetNode(ctx, &v1.GetNodeRequest{Name: fleet.Node})
	if err != nil || n.Bmc != nil {
		t.Fatalf("node after the refused update = %v, %v", n, err)
	}
	// Operators still drive nodes: every other field is theirs.
	if _, err := op.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: fleet.Node, UpdateMask: []string{"macs"}, Macs: []string{"52:54:00:00:00:bb"}}); err != nil {
		t.Fatalf("operator updating macs: %v", err)
	}
	if _, err := op.CreateNode(ctx, &v1.CreateNodeRequest{Name: "plain", Template: fleet.Template}); err != nil {
		t.Fatalf("operator creating a node without a BMC: %v", err)
	}
	// An admin may set the very same BMC: the refusal is the role's.
	if _, err := cp.Admin.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: fleet.Node, UpdateMask: []string{"bmc"}, Bmc: bmc}); err != nil {
		t.Fatalf("admin setting the bmc: %v", err)
	}
	if heard.Load() != 0 {
		t.Fatalf("the operator's server was reached %d times", heard.Load())
	}
}
