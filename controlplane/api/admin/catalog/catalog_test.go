package catalog_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/api/admin/adminkit"
	admincatalog "github.com/tetherfleet/tether/controlplane/api/admin/catalog"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/internal/testkit/admintest"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// serve starts only the catalog RPCs, over a real store.
func serve(t *testing.T) *admincatalog.Server {
	t.Helper()
	env := admintest.New(t)
	env.Module(t, "rootfs", "1")
	s, err := admincatalog.New(admincatalog.Config{Catalog: env.Services.Catalog, Registry: env.Services.Registry, Store: env.Store, Log: env.Log})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var root = []*v1.ModuleRef{{Name: "rootfs", Version: "1"}}

// catalogState is what a refused call must leave as it was.
func catalogState(t *testing.T, s *admincatalog.Server) string {
	t.Helper()
	ctx := context.Background()
	tpls, err := s.ListTemplates(ctx, &v1.ListTemplatesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := s.ListNodes(ctx, &v1.ListNodesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, x := range tpls.Templates {
		out = append(out, "t:"+x.Name+"/"+x.KernelArgs+"/"+x.UpdatedAt.String())
	}
	for _, x := range nodes.Nodes {
		out = append(out, "n:"+x.Name+"/"+x.TemplateName+"/"+strings.Join(x.Macs, "+")+"/"+x.UpdatedAt.String())
	}
	return strings.Join(out, ",")
}

func TestCatalogRPCs(t *testing.T) {
	s := serve(t)
	ctx := admintest.As("olga", adminkit.RoleOperator)
	tpl, err := s.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: "base", KernelArgs: "quiet", RootModules: root})
	if err != nil || tpl.Name != "base" || tpl.KernelArgs != "quiet" {
		t.Fatalf("CreateTemplate = %v, %v", tpl, err)
	}
	n, err := s.CreateNode(ctx, &v1.CreateNodeRequest{Name: "n1", Template: "base", Macs: []string{"52:54:00:AA:BB:CC"}})
	if err != nil || n.TemplateName != "base" || len(n.Macs) != 1 || n.Macs[0] != "52:54:00:aa:bb:cc" {
		t.Fatalf("CreateNode = %v, %v; want n1 over base, its MAC normalised", n, err)
	}
	got, err := s.UpdateTemplate(ctx, &v1.UpdateTemplateRequest{Name: "base", UpdateMask: []string{"kernel_args"}, KernelArgs: "console=ttyS0"})
	if err != nil || got.KernelArgs != "console=ttyS0" {
		t.Fatalf("UpdateTemplate = %v, %v", got, err)
	}
	if _, err := s.DeleteTemplate(ctx, &v1.DeleteTemplateRequest{Name: "base"}); fail.Code(err) != codes.FailedPrecondition {
		t.Fatalf("DeleteTemplate of a template in use = %v; want FailedPrecondition", err)
	}
	if _, err := s.DeleteNode(ctx, &v1.DeleteNodeRequest{Name: "n1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteTemplate(ctx, &v1.DeleteTemplateRequest{Name: "base"}); err != nil {
		t.Fatal(err)
	}
	if st := catalogState(t, s); st != "" {
		t.Fatalf("catalog = %q after deleting both; want it empty", st)
	}
}

func TestCatalogRPCsRefuseBadInput(t *testing.T) {
	s := serve(t)
	op := admintest.As("olga", adminkit.RoleOperator)
	if _, err := s.CreateTemplate(op, &v1.CreateTemplateRequest{Name: "base", RootModules: root}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateNode(op, &v1.CreateNodeRequest{Name: "n1", Template: "base"}); err != nil {
		t.Fatal(err)
	}
	before := catalogState(t, s)
	tests := []struct {
		name  string
		call  func() error
		code  codes.Code
		field string
	}{
		{"template with a newline in its kernel args", func() error {
			_, err := s.CreateTemplate(op, &v1.CreateTemplateRequest{Name: "evil", KernelArgs: "quiet\nshell", RootModules: root})
			return err
		}, codes.InvalidArgument, "kernel_args"},
		{"template with an unknown console", func() error {
			_, err := s.CreateTemplate(op, &v1.CreateTemplateRequest{Name: "c", Console: "lp0;rm", RootModules: root})
			return err
		}, codes.InvalidArgument, "console"},
		{"update naming nothing", func() error {
			_, err := s.UpdateTemplate(op, &v1.UpdateTemplateRequest{Name: "base", KernelArgs: "quiet"})
			return err
		}, codes.InvalidArgument, "update_mask"},
		{"node with a bad MAC", func() error {
			_, err := s.CreateNode(op, &v1.CreateNodeRequest{Name: "n2", Template: "base", Macs: []string{"not-a-mac"}})
			return err
		}, codes.InvalidArgument, "macs"},
		{"adopt a bad MAC", func() error {
			_, err := s.AdoptNode(admintest.As("ada", adminkit.RoleAdmin), &v1.AdoptNodeRequest{Mac: "zz"})
			return err
		}, codes.InvalidArgument, "mac"},
		{"list nodes with a negative page size", func() error {
			_, err := s.ListNodes(op, &v1.ListNodesRequest{PageSize: -1})
			return err
		}, codes.InvalidArgument, "page_size"},
		{"an operator binds an EK", func() error {
			_, err := s.CreateNode(op, &v1.CreateNodeRequest{Name: "n3", Template: "base",
				EkHashes: []string{"sha256:" + strings.Repeat("ab", 32)}})
			return err
		}, codes.PermissionDenied, "ek_hashes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if fail.Code(err) != tt.code || !strings.Contains(status.Convert(err).Message(), tt.field) {
				t.Fatalf("err = %v; want %v naming %s", err, tt.code, tt.field)
			}
			if tt.code == codes.InvalidArgument && !strings.HasPrefix(status.Convert(err).Message(), tt.field+":") {
				t.Fatalf("err = %v; want the message to start with %s", err, tt.field)
			}
			if after := catalogState(t, s); after != before {
				t.Fatalf("catalog = %q after a refused call; want %q", after, before)
			}
		})
	}
}

func TestNewNamesWhatIsMissing(t *testing.T) {
	if _, err := admincatalog.New(admincatalog.Config{}); err == nil || !strings.Contains(err.Error(), "Config.Catalog") {
		t.Fatalf("New = %v; want the missing Catalog named", err)
	}
}
