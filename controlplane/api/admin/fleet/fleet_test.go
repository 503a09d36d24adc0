package fleet_test

import (
	"context"
	"testing"

	"github.com/tetherfleet/tether/controlplane/api/admin/adminkit"
	"github.com/tetherfleet/tether/controlplane/api/admin/fleet"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/testkit/admintest"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// serve starts only the fleet handlers, over a real store.
func serve(t *testing.T) (*fleet.Server, *admintest.Env, *revoked) {
	t.Helper()
	env := admintest.New(t)
	rv := &revoked{}
	s, err := fleet.New(fleet.Config{Instances: env.Services.Instances, Certificates: env.Services.Certificates, Reads: env.Store,
		Clock: env.Clock, CAFingerprint: env.CA.Fingerprint, AgentURL: "https://127.0.0.1:7443", Revoked: rv})
	if err != nil {
		t.Fatal(err)
	}
	return s, env, rv
}

type revoked struct{ serials []store.CertSerial }

func (r *revoked) Add(serials ...store.CertSerial) { r.serials = append(r.serials, serials...) }

func TestNewNamesWhatIsMissing(t *testing.T) {
	if _, err := fleet.New(fleet.Config{}); err == nil {
		t.Fatal("New with nothing: want an error naming a missing dependency")
	}
}

func TestProvisionListAndToken(t *testing.T) {
	s, env, _ := serve(t)
	ctx := admintest.As("olga", adminkit.RoleOperator)
	env.Instance(t, "n0") // a node and template to provision another instance of
	if _, err := env.Services.Catalog.CreateNode(context.Background(), &store.Node{Name: "n1", Enabled: true}, "n0-tpl"); err != nil {
		t.Fatal(err)
	}
	p, err := s.ProvisionInstance(ctx, &v1.ProvisionInstanceRequest{Node: "n1", Provider: "fake"})
	if err != nil || p.Instance.NodeName != "n1" || p.TaskId == "" || p.CaFingerprint != env.CA.Fingerprint() || p.ControlPlaneUrl != "https://127.0.0.1:7443" {
		t.Fatalf("ProvisionInstance = %v, %v; want n1's instance, its provision task, the CA and the URL", p, err)
	}
	got, err := s.GetInstance(ctx, &v1.GetInstanceRequest{Id: p.Instance.Id})
	if err != nil || got.Id != p.Instance.Id || got.NodeName != "n1" {
		t.Fatalf("GetInstance = %v, %v", got, err)
	}
	list, err := s.ListInstances(ctx, &v1.ListInstancesRequest{Node: "n1"})
	if err != nil || len(list.Instances) != 1 || list.Instances[0].Id != p.Instance.Id {
		t.Fatalf("ListInstances(n1) = %v, %v; want the one instance", list, err)
	}
	tok, err := s.CreateBootstrapToken(ctx, &v1.CreateBootstrapTokenRequest{InstanceId: p.Instance.Id, TtlSeconds: 600})
	if err != nil || tok.Token == "" || tok.InstanceId != p.Instance.Id {
		t.Fatalf("CreateBootstrapToken = %v, %v", tok, err)
	}
}

// Bad input is refused naming the field, and changes nothing: no
// instance, no token and no revocation.
func TestFleetRefusesBadInput(t *testing.T) {
	s, env, rv := serve(t)
	ctx := admintest.As("olga", adminkit.RoleOperator)
	in := env.Instance(t, "n1")
	count := func() int {
		list, err := s.ListInstances(ctx, &v1.ListInstancesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return len(list.Instances)
	}
	before := count()
	tests := []struct {
		name  string
		call  func() error
		field string
	}{
		{"get naming nothing", func() error { _, err := s.GetInstance(ctx, &v1.GetInstanceRequest{}); return err }, "id"},
		{"list with a negative page size", func() error {
			_, err := s.ListInstances(ctx, &v1.ListInstancesRequest{PageSize: -1})
			return err
		}, "page_size"},
		{"token for no instance", func() error {
			_, err := s.CreateBootstrapToken(ctx, &v1.CreateBootstrapTokenRequest{})
			return err
		}, "instance_id"},
		{"token living past a week", func() error {
			_, err := s.CreateBootstrapToken(ctx, &v1.CreateBootstrapTokenRequest{InstanceId: in.ID.String(), TtlSeconds: 8 * 24 * 3600})
			return err
		}, "ttl_seconds"},
		{"revoke naming no serial", func() error {
			_, err := s.RevokeCertificate(ctx, &v1.RevokeCertificateRequest{})
			return err
		}, "serial"},
		{"revoke with a novel for a reason", func() error {
			_, err := s.RevokeCertificate(ctx, &v1.RevokeCertificateRequest{Serial: "01", Reason: string(make([]byte, 1025))})
			return err
		}, "reason"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			admintest.WantInvalid(t, tt.call(), tt.field)
			if after := count(); after != before || len(rv.serials) != 0 {
				t.Fatalf("%d instances, revoked %v after a refused call; want %d and none", after, rv.serials, before)
			}
		})
	}
}
