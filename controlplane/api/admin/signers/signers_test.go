package signers_test

import (
	"context"
	"crypto/ed25519"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/tetherfleet/tether/controlplane/api/admin/adminkit"
	"github.com/tetherfleet/tether/controlplane/api/admin/signers"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/internal/testkit/admintest"
	"github.com/tetherfleet/tether/pki"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// serve starts only the signer RPCs, over a real store.
func serve(t *testing.T) *signers.Server {
	t.Helper()
	s, err := signers.New(signers.Config{Registry: admintest.New(t).Services.Registry})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func names(t *testing.T, s *signers.Server) string {
	t.Helper()
	resp, err := s.ListSigners(context.Background(), &v1.ListSignersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, x := range resp.Signers {
		out = append(out, x.Name+"="+x.Fingerprint)
	}
	return strings.Join(out, ",")
}

var key = ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize)).Public().(ed25519.PublicKey)

func TestSignerRPCs(t *testing.T) {
	s := serve(t)
	ctx := admintest.As("ada", adminkit.RoleAdmin)
	got, err := s.AddSigner(ctx, &v1.AddSignerRequest{Name: "release", PublicKey: key})
	if err != nil || got.Fingerprint != pki.SignerFingerprint(key) || got.CreatedAt.AsTime() != admintest.T0 {
		t.Fatalf("AddSigner = %v, %v; want the key's fingerprint, stamped now", got, err)
	}
	if n := names(t, s); n != "release="+got.Fingerprint {
		t.Fatalf("signers = %q; want the one added", n)
	}
	if _, err := s.RemoveSigner(ctx, &v1.RemoveSignerRequest{Signer: "release"}); err != nil {
		t.Fatal(err)
	}
	if n := names(t, s); n != "" {
		t.Fatalf("signers = %q after removing it; want none", n)
	}
}

func TestSignerRPCsRefuseBadInput(t *testing.T) {
	s := serve(t)
	ctx := admintest.As("ada", adminkit.RoleAdmin)
	if _, err := s.AddSigner(ctx, &v1.AddSignerRequest{Name: "release", PublicKey: key}); err != nil {
		t.Fatal(err)
	}
	before := names(t, s)
	tests := []struct {
		name  string
		call  func() error
		field string
	}{
		{"add without a name", func() error {
			_, err := s.AddSigner(ctx, &v1.AddSignerRequest{PublicKey: key})
			return err
		}, "name"},
		{"add a short key", func() error {
			_, err := s.AddSigner(ctx, &v1.AddSignerRequest{Name: "short", PublicKey: key[:16]})
			return err
		}, "public_key"},
		{"remove naming nothing", func() error {
			_, err := s.RemoveSigner(ctx, &v1.RemoveSignerRequest{})
			return err
		}, "signer"},
		{"sign without a signature", func() error {
			_, err := s.SignModule(ctx, &v1.SignModuleRequest{Name: "m", Version: "1"})
			return err
		}, "signature"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			admintest.WantInvalid(t, err, tt.field)
			if after := names(t, s); after != before {
				t.Fatalf("signers = %q after a refused call; want %q", after, before)
			}
		})
	}
	if _, err := s.AddSigner(ctx, &v1.AddSignerRequest{Name: "release", PublicKey: key}); fail.Code(err) != codes.AlreadyExists {
		t.Fatalf("AddSigner again = %v; want AlreadyExists", err)
	}
}

func TestNewNamesTheRegistry(t *testing.T) {
	if _, err := signers.New(signers.Config{}); err == nil || !strings.Contains(err.Error(), "Registry") {
		t.Fatalf("New without a registry = %v; want it named", err)
	}
}
