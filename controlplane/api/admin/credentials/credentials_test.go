package credentials_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/tetherfleet/tether/controlplane/api/admin/adminkit"
	"github.com/tetherfleet/tether/controlplane/api/admin/credentials"
	bmccreds "github.com/tetherfleet/tether/controlplane/credentials"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/internal/testkit/admintest"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// serve starts only the credential RPCs, over a real store and sealer.
func serve(t *testing.T) *credentials.Server {
	t.Helper()
	env := admintest.New(t)
	sealer, _, err := bmccreds.LoadOrCreateKey(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s, err := credentials.New(credentials.Config{Credentials: &bmccreds.Service{Store: env.Store, Clock: env.Clock, Sealer: sealer}})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func listed(t *testing.T, s *credentials.Server) string {
	t.Helper()
	resp, err := s.ListCredentials(context.Background(), &v1.ListCredentialsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range resp.Credentials {
		out = append(out, c.Name+"="+c.Username)
	}
	return strings.Join(out, ",")
}

func TestCredentialRPCs(t *testing.T) {
	s := serve(t)
	ctx := admintest.As("ada", adminkit.RoleAdmin)
	c, err := s.CreateCredential(ctx, &v1.CreateCredentialRequest{Name: "rack-a", Username: "root", Password: "calvin"})
	if err != nil || c.Name != "rack-a" || c.Username != "root" {
		t.Fatalf("CreateCredential = %v, %v", c, err)
	}
	if strings.Contains(c.String(), "calvin") {
		t.Fatal("the answer carries the password")
	}
	if _, err := s.UpdateCredential(ctx, &v1.UpdateCredentialRequest{Name: "rack-a", Username: "admin", Password: "hunter2"}); err != nil {
		t.Fatal(err)
	}
	if l := listed(t, s); l != "rack-a=admin" {
		t.Fatalf("credentials = %q; want rack-a with the new user name", l)
	}
	if _, err := s.DeleteCredential(ctx, &v1.DeleteCredentialRequest{Name: "rack-a"}); err != nil {
		t.Fatal(err)
	}
	if l := listed(t, s); l != "" {
		t.Fatalf("credentials = %q after delete; want none", l)
	}
}

func TestCredentialRPCsRefuseBadInput(t *testing.T) {
	s := serve(t)
	ctx := admintest.As("ada", adminkit.RoleAdmin)
	if _, err := s.CreateCredential(ctx, &v1.CreateCredentialRequest{Name: "rack-a", Username: "root", Password: "calvin"}); err != nil {
		t.Fatal(err)
	}
	before := listed(t, s)
	tests := []struct {
		name  string
		call  func() error
		field string
	}{
		{"create with a bad name", func() error {
			_, err := s.CreateCredential(ctx, &v1.CreateCredentialRequest{Name: "no spaces", Username: "root", Password: "x"})
			return err
		}, "name"},
		{"update naming nothing", func() error {
			_, err := s.UpdateCredential(ctx, &v1.UpdateCredentialRequest{Username: "root", Password: "x"})
			return err
		}, "name"},
		{"delete naming nothing", func() error {
			_, err := s.DeleteCredential(ctx, &v1.DeleteCredentialRequest{})
			return err
		}, "name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			admintest.WantInvalid(t, err, tt.field)
			if after := listed(t, s); after != before {
				t.Fatalf("credentials = %q after a refused call; want %q", after, before)
			}
		})
	}
}

// Without a credential store every RPC refuses with FailedPrecondition.
func TestCredentialRPCsWithoutAStore(t *testing.T) {
	s, err := credentials.New(credentials.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.ListCredentials(context.Background(), &v1.ListCredentialsRequest{}); fail.Code(err) != codes.FailedPrecondition {
		t.Fatalf("ListCredentials = %v; want FailedPrecondition", err)
	}
}
