package servertest

import (
	"testing"
	"time"

	"github.com/tetherfleet/tether/internal/testkit/testcp"
	"github.com/tetherfleet/tether/pki"
	"github.com/tetherfleet/tether/pki/ca"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// A CA rotation taken on replica A is followed by replica B on the same
// database and data dir: B pushes the new bundle to its agents, signs with
// the key A prepared (unsealed under the shared credentials.key), and a
// second prepare on B is refused while A's is pending.
func TestRotationOnAIsFollowedByB(t *testing.T) {
	ctx := ctxT(t, 90*time.Second)
	a, b := twoReplicas(t, pg.DSN(t))
	fleet := a.SeedFleet(ctx, "edge")
	ag := enrollAgent(t, ctx, a, b, fleet.Node)

	prepared, err := a.Admin.PrepareCA(ctx, &v1.PrepareCARequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Admin.PrepareCA(ctx, &v1.PrepareCARequest{}); err == nil {
		t.Fatal("a second prepare on B was accepted while A's is pending")
	}
	if _, err := a.Admin.ActivateCA(ctx, &v1.ActivateCARequest{Fingerprint: prepared.Fingerprint}); err != nil {
		t.Fatal(err)
	}
	// B's agent hears of both steps through B, which followed A.
	for roots, active := 0, ""; active != prepared.Fingerprint; {
		msg, err := ag.stream.Recv()
		if err != nil {
			t.Fatalf("B's stream ended: %v", err)
		}
		if tb := msg.GetTrustBundle(); tb != nil {
			roots, active = len(tb.Roots), tb.ActiveFingerprint
			if roots != 2 {
				t.Fatalf("bundle from B: %d roots", roots)
			}
		}
	}
	// B signs with the new CA; A trusts what B signed.
	_, token := a.Provision(ctx, fleet.Node)
	key := testcp.NewNodeKey(t)
	resp, err := v1.NewEnrollmentServiceClient(b.Dial(nil)).Enroll(ctx, &v1.EnrollRequest{Token: token, CsrPem: key.CSRPEM})
	if err != nil {
		t.Fatal(err)
	}
	issuer, err := ca.ParseCertificatePEM([]byte(resp.CaPem))
	if err != nil || pki.Fingerprint(issuer.Raw) != prepared.Fingerprint {
		t.Fatalf("B enrolled under %v (%v), want %s", issuer, err, prepared.Fingerprint)
	}
	cert := key.Certificate(t, resp.CertificatePem)
	if _, err := v1.NewAgentServiceClient(a.Dial(&cert)).GetAssignment(ctx, &v1.GetAssignmentRequest{}); err != nil {
		t.Fatalf("A refuses a certificate B signed with the new CA: %v", err)
	}
	list, err := b.Admin.ListCAs(ctx, &v1.ListCAsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Authorities) != 2 || list.Authorities[1].State != "active" || list.Authorities[1].LiveCertificates != 1 {
		t.Fatalf("B's list: %v", list.Authorities)
	}
}
