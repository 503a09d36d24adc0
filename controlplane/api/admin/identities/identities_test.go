package identities_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/tetherfleet/tether/controlplane/api/admin/adminkit"
	"github.com/tetherfleet/tether/controlplane/api/admin/identities"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/testkit/admintest"
	"github.com/tetherfleet/tether/pki"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// revoked records what the handler adds to this replica's set.
type revoked struct {
	mu      sync.Mutex
	serials []store.CertSerial
}

func (r *revoked) Add(s ...store.CertSerial) {
	r.mu.Lock()
	r.serials = append(r.serials, s...)
	r.mu.Unlock()
}

// serve starts only the identity RPCs, over a real store.
func serve(t *testing.T) (*identities.Server, *revoked) {
	t.Helper()
	env := admintest.New(t)
	rv := &revoked{}
	s, err := identities.New(identities.Config{Certificates: env.Services.Certificates, Reads: env.Store, Revoked: rv, Clock: env.Clock})
	if err != nil {
		t.Fatal(err)
	}
	return s, rv
}

func csr(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

func listed(t *testing.T, s *identities.Server) string {
	t.Helper()
	resp, err := s.ListIdentities(context.Background(), &v1.ListIdentitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, id := range resp.Identities {
		out = append(out, id.Name+"/"+id.Role+"/"+id.Serial+"/"+id.RevokedAt.String())
	}
	return strings.Join(out, ",")
}

func TestIdentityRPCs(t *testing.T) {
	s, rv := serve(t)
	ada := admintest.As("ada", adminkit.RoleAdmin)
	got, err := s.CreateIdentity(ada, &v1.CreateIdentityRequest{Name: "bob", Role: adminkit.RoleOperator.String(), CsrPem: csr(t)})
	if err != nil || got.Identity.Name != "bob" || got.Identity.Role != adminkit.RoleOperator.String() || got.CertificatePem == "" || got.CaPem == "" {
		t.Fatalf("CreateIdentity = %v, %v; want bob's operator certificate and the CA", got, err)
	}
	if l := listed(t, s); !strings.HasPrefix(l, "bob/operator/"+got.Identity.Serial) {
		t.Fatalf("identities = %q; want bob", l)
	}
	// bob renews himself: a new serial, the same role.
	bob := adminkit.WithCaller(context.Background(), adminkit.Caller{Identity: pki.Identity{Kind: pki.KindAdmin, Name: "bob", Role: adminkit.RoleOperator.String()},
		Serial: store.CertSerial(got.Identity.Serial), NotAfter: got.Identity.NotAfter.AsTime()})
	renewed, err := s.RenewIdentity(bob, &v1.RenewIdentityRequest{CsrPem: csr(t)})
	if err != nil || renewed.Identity.Serial == got.Identity.Serial || renewed.Identity.Role != adminkit.RoleOperator.String() ||
		renewed.Identity.NotAfter.AsTime().After(got.Identity.NotAfter.AsTime()) {
		t.Fatalf("RenewIdentity = %v, %v; want a new serial, the same role, ending no later", renewed, err)
	}
	revokedID, err := s.RevokeIdentity(ada, &v1.RevokeIdentityRequest{Name: "bob"})
	if err != nil || revokedID.RevokedAt == nil {
		t.Fatalf("RevokeIdentity = %v, %v; want bob revoked", revokedID, err)
	}
	if len(rv.serials) != 2 {
		t.Fatalf("revocation set got %v; want both of bob's serials at once", rv.serials)
	}
	audit, err := s.ListAudit(ada, &v1.ListAuditRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// The handlers write no audit record themselves: the auth interceptor does.
	if len(audit.Records) != 0 {
		t.Fatalf("audit = %v; want none written by the handlers", audit.Records)
	}
}

func TestIdentityRPCsRefuseBadInput(t *testing.T) {
	s, rv := serve(t)
	ada := admintest.As("ada", adminkit.RoleAdmin)
	if _, err := s.CreateIdentity(ada, &v1.CreateIdentityRequest{Name: "bob", Role: adminkit.RoleViewer.String(), CsrPem: csr(t)}); err != nil {
		t.Fatal(err)
	}
	before := listed(t, s)
	good := csr(t)
	tests := []struct {
		name  string
		call  func() error
		field string
	}{
		{"create without a name", func() error {
			_, err := s.CreateIdentity(ada, &v1.CreateIdentityRequest{Role: adminkit.RoleViewer.String(), CsrPem: good})
			return err
		}, "name"},
		{"create with an unknown role", func() error {
			_, err := s.CreateIdentity(ada, &v1.CreateIdentityRequest{Name: "eve", Role: "root", CsrPem: good})
			return err
		}, "role"},
		{"create for too long", func() error {
			_, err := s.CreateIdentity(ada, &v1.CreateIdentityRequest{Name: "eve", Role: adminkit.RoleViewer.String(), CsrPem: good, TtlSeconds: 400 * 24 * 3600})
			return err
		}, "ttl_seconds"},
		{"create without a CSR", func() error {
			_, err := s.CreateIdentity(ada, &v1.CreateIdentityRequest{Name: "eve", Role: adminkit.RoleViewer.String(), CsrPem: "not pem"})
			return err
		}, "csr_pem"},
		{"renew with a negative lifetime", func() error {
			_, err := s.RenewIdentity(ada, &v1.RenewIdentityRequest{CsrPem: good, TtlSeconds: -1})
			return err
		}, "ttl_seconds"},
		{"revoke naming nobody", func() error {
			_, err := s.RevokeIdentity(ada, &v1.RevokeIdentityRequest{})
			return err
		}, "name"},
		{"audit with a negative page size", func() error {
			_, err := s.ListAudit(ada, &v1.ListAuditRequest{PageSize: -1})
			return err
		}, "page_size"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			admintest.WantInvalid(t, err, tt.field)
			if after := listed(t, s); after != before || len(rv.serials) != 0 {
				t.Fatalf("identities = %q, revoked %v after a refused call; want %q and none", after, rv.serials, before)
			}
		})
	}
	if _, err := s.CreateIdentity(ada, &v1.CreateIdentityRequest{Name: "bob", Role: adminkit.RoleAdmin.String(), CsrPem: good}); fail.Code(err) != codes.AlreadyExists {
		t.Fatalf("create bob again = %v; want AlreadyExists", err)
	}
	if _, err := s.RenewIdentity(context.Background(), &v1.RenewIdentityRequest{CsrPem: good}); fail.Code(err) != codes.Unauthenticated {
		t.Fatalf("renew with no caller = %v; want Unauthenticated", err)
	}
}

func TestNewNamesWhatIsMissing(t *testing.T) {
	if _, err := identities.New(identities.Config{}); err == nil || !strings.Contains(err.Error(), "Config.Certificates") {
		t.Fatalf("New = %v; want the missing Certificates named", err)
	}
}
