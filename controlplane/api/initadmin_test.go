package api_test

import (
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	"github.com/tetherfleet/tether/pki/ca"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// The admin `tetherd init` mints is an identity like any other: listed,
// its certificate recorded, revocable by name and by serial; and
// `tetherd init --rotate-admin` replaces it, revoking what it held.
func TestInitAdminIsAnIdentity(t *testing.T) {
	cp := testcp.Start(t)
	ctx := ctxT(t)
	first := cp.AdminCert
	firstSerial := ca.SerialString(first.Leaf)
	ids, err := cp.Admin.ListIdentities(ctx, &v1.ListIdentitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(ids.Identities) != 1 || ids.Identities[0].Name != "admin" || ids.Identities[0].Role != "admin" || ids.Identities[0].Serial != firstSerial {
		t.Fatalf("identities = %v, want the init admin with serial %s", ids.Identities, firstSerial)
	}
	certs, err := cp.Admin.ListCertificates(ctx, &v1.ListCertificatesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(certs.Certificates) != 1 || certs.Certificates[0].Serial != firstSerial {
		t.Fatalf("certificates = %v, want the init admin's", certs.Certificates)
	}
	// A second admin revokes the first by name.
	other := mint(t, cp, "root2", "admin", 0)
	root2 := v1.NewAdminServiceClient(cp.Dial(&other))
	if _, err := root2.RevokeIdentity(ctx, &v1.RevokeIdentityRequest{Name: "admin"}); err != nil {
		t.Fatalf("identity revoke admin: %v", err)
	}
	_, err = cp.Admin.ListNodes(ctx, &v1.ListNodesRequest{})
	wantMsg(t, err, codes.Unauthenticated, "revoked")
	// A restart does not adopt the revoked certificate again.
	cp.Restart()
	_, err = v1.NewAdminServiceClient(cp.Dial(&first)).ListNodes(ctx, &v1.ListNodesRequest{})
	wantMsg(t, err, codes.Unauthenticated, "revoked")

	// --rotate-admin mints a new one, which the next start records.
	cp.Stop()
	if err := daemon.Init(daemon.InitOptions{DataDir: cp.DataDir, RotateAdmin: true}); err != nil {
		t.Fatal(err)
	}
	cp.Restart()
	if ca.SerialString(cp.AdminCert.Leaf) == firstSerial {
		t.Fatal("rotation kept the serial")
	}
	if _, err := cp.Admin.ListNodes(ctx, &v1.ListNodesRequest{}); err != nil {
		t.Fatalf("the rotated admin: %v", err)
	}
	ids, err = cp.Admin.ListIdentities(ctx, &v1.ListIdentitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids.Identities {
		if id.Name == "admin" && (id.RevokedAt != nil || id.Serial != ca.SerialString(cp.AdminCert.Leaf)) {
			t.Fatalf("rotated admin identity = %v", id)
		}
	}
	_, err = v1.NewAdminServiceClient(cp.Dial(&first)).ListNodes(ctx, &v1.ListNodesRequest{})
	wantMsg(t, err, codes.Unauthenticated, "revoked")

	// Rotating again while the admin is live revokes the live one, and
	// `cert revoke` finds an init admin's serial.
	live := cp.AdminCert
	cp.Stop()
	if err := daemon.Init(daemon.InitOptions{DataDir: cp.DataDir, RotateAdmin: true}); err != nil {
		t.Fatal(err)
	}
	cp.Restart()
	_, err = v1.NewAdminServiceClient(cp.Dial(&live)).ListNodes(ctx, &v1.ListNodesRequest{})
	wantMsg(t, err, codes.Unauthenticated, "revoked")
	if _, err := root2.RevokeCertificate(ctx, &v1.RevokeCertificateRequest{Serial: ca.SerialString(cp.AdminCert.Leaf)}); err != nil {
		t.Fatalf("cert revoke of the init admin: %v", err)
	}
	_, err = cp.Admin.ListNodes(ctx, &v1.ListNodesRequest{})
	wantMsg(t, err, codes.Unauthenticated, "revoked")
}
