package ca_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/tetherfleet/tether/controlplane/api/admin/adminkit"
	adminca "github.com/tetherfleet/tether/controlplane/api/admin/ca"
	"github.com/tetherfleet/tether/controlplane/carotation"
	"github.com/tetherfleet/tether/controlplane/credentials"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/internal/testkit/admintest"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// serve starts only the CA rotation RPCs, over a real store and a
// rotation set started as tetherd starts it.
func serve(t *testing.T) *adminca.Server {
	t.Helper()
	env := admintest.New(t)
	sealer, err := credentials.NewSealer(make([]byte, 32))
	if err != nil {
		t.Fatal(err)
	}
	rot := &carotation.Service{Store: env.Store, CA: env.CA, First: env.CA.Certificate(), FirstKey: env.CA.Key(), Sealer: sealer,
		Clock: env.Clock, Log: env.Log}
	if err := rot.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	s, err := adminca.New(adminca.Config{CAs: rot})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func states(t *testing.T, s *adminca.Server) string {
	t.Helper()
	resp, err := s.ListCAs(context.Background(), &v1.ListCAsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range resp.Authorities {
		out = append(out, a.State)
	}
	return strings.Join(out, ",")
}

func TestCARotationRPCs(t *testing.T) {
	s := serve(t)
	ctx := admintest.As("ada", adminkit.RoleAdmin)
	if got := states(t, s); got != "active" {
		t.Fatalf("states = %q; want the data dir's CA active", got)
	}
	next, err := s.PrepareCA(ctx, &v1.PrepareCARequest{})
	if err != nil || next.State != "prepared" || next.CertificatePem == "" {
		t.Fatalf("PrepareCA = %v, %v; want a prepared CA with its certificate", next, err)
	}
	got, err := s.ActivateCA(ctx, &v1.ActivateCARequest{Fingerprint: next.Fingerprint})
	if err != nil || got.State != "active" {
		t.Fatalf("ActivateCA = %v, %v; want it active", got, err)
	}
	if got := states(t, s); !strings.Contains(got, "active") || strings.Count(got, ",") != 1 {
		t.Fatalf("states = %q after the rotation; want two CAs, one active", got)
	}
}

func TestCARotationRPCsRefuseBadInput(t *testing.T) {
	s := serve(t)
	ctx := admintest.As("ada", adminkit.RoleAdmin)
	before := states(t, s)
	tests := []struct {
		name  string
		call  func() error
		field string
	}{
		{"prepare an unknown key type", func() error {
			_, err := s.PrepareCA(ctx, &v1.PrepareCARequest{KeyType: "rot13"})
			return err
		}, "key_type"},
		{"activate a malformed fingerprint", func() error {
			_, err := s.ActivateCA(ctx, &v1.ActivateCARequest{Fingerprint: "not-a-fingerprint"})
			return err
		}, "fingerprint"},
		{"retire naming nothing", func() error {
			_, err := s.RetireCA(ctx, &v1.RetireCARequest{})
			return err
		}, "fingerprint"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			admintest.WantInvalid(t, err, tt.field)
			if after := states(t, s); after != before {
				t.Fatalf("states = %q after a refused call; want %q", after, before)
			}
		})
	}
}

// Without a rotation set every RPC refuses with FailedPrecondition.
func TestCARotationRPCsWithoutASet(t *testing.T) {
	s, err := adminca.New(adminca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.ListCAs(context.Background(), &v1.ListCAsRequest{}); fail.Code(err) != codes.FailedPrecondition {
		t.Fatalf("ListCAs = %v; want FailedPrecondition", err)
	}
}
