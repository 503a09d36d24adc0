package certificates_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/tetherfleet/tether/controlplane/certificates"
	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/pki/ca"
)

func identityService(t *testing.T) (*certificates.Service, store.Store) {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	clk := clock.NewFake(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	authority, err := ca.Create(filepath.Join(dir, "ca"), "identities-test", clk)
	if err != nil {
		t.Fatal(err)
	}
	return &certificates.Service{Store: st, Clock: clk, CA: authority}, st
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func countEvents(t *testing.T, st store.Store, kind store.EventKind) int {
	t.Helper()
	evs, err := st.ListEvents(context.Background(), store.EventFilter{Kind: kind}, store.Page{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	return len(evs)
}

// Issuing records the certificate, the identity and cert.issued together;
// a create over an existing identity and a renewal of a revoked one write
// nothing.
func TestIssueAndRevokeIdentity(t *testing.T) {
	ctx := context.Background()
	s, st := identityService(t)
	got, err := s.IssueIdentity(ctx, certificates.IdentityIssue{Name: "bob", Role: "operator", Key: newKey(t).Public(), By: "ada"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Identity.Serial.String() != ca.SerialString(got.Cert) || got.Issuer == nil {
		t.Fatalf("IssueIdentity = %+v; want the certificate's serial recorded and its issuer", got.Identity)
	}
	if c, err := st.GetCertificate(ctx, got.Identity.Serial); err != nil || c.Kind != "admin" {
		t.Fatalf("certificate = %+v, %v; want the admin certificate recorded", c, err)
	}
	if n := countEvents(t, st, events.CertIssued); n != 1 {
		t.Fatalf("%d cert.issued events; want 1", n)
	}
	if _, err := s.IssueIdentity(ctx, certificates.IdentityIssue{Name: "bob", Role: "admin", Key: newKey(t).Public()}); fail.Code(err) != codes.AlreadyExists {
		t.Fatalf("create over an existing identity = %v; want AlreadyExists", err)
	}
	renewed, err := s.IssueIdentity(ctx, certificates.IdentityIssue{Name: "bob", Role: "operator", Key: newKey(t).Public(), Renew: true})
	if err != nil || renewed.Identity.Serial == got.Identity.Serial || !renewed.Identity.CreatedAt.Equal(got.Identity.CreatedAt) {
		t.Fatalf("renew = %+v, %v; want a new serial, the identity's creation kept", renewed, err)
	}

	notes, stop := st.Subscribe(store.ChannelRevocations)
	defer stop()
	id, serials, err := s.RevokeAdminIdentity(ctx, "bob", "ada")
	if err != nil || id.RevokedAt.IsZero() || len(serials) != 2 {
		t.Fatalf("RevokeAdminIdentity = %+v, %v, %v; want both certificates revoked", id, serials, err)
	}
	for range serials {
		select {
		case <-notes:
		case <-time.After(10 * time.Second):
			t.Fatal("no revocation notification")
		}
	}
	if n := countEvents(t, st, events.CertRevoked); n != 1 {
		t.Fatalf("%d cert.revoked events; want 1", n)
	}
	if _, err := s.IssueIdentity(ctx, certificates.IdentityIssue{Name: "bob", Role: "operator", Key: newKey(t).Public(), Renew: true}); fail.Code(err) != codes.FailedPrecondition {
		t.Fatalf("renew a revoked identity = %v; want FailedPrecondition", err)
	}
	if n := countEvents(t, st, events.CertIssued); n != 2 {
		t.Fatalf("%d cert.issued events after the refusals; want 2", n)
	}
	if _, _, err := s.RevokeAdminIdentity(ctx, "nobody", "ada"); fail.Code(err) != codes.NotFound {
		t.Fatalf("revoke an unknown identity = %v; want NotFound", err)
	}
}
