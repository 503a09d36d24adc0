package pools_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/tetherfleet/tether/controlplane/api/admin/adminkit"
	"github.com/tetherfleet/tether/controlplane/api/admin/pools"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/internal/testkit/admintest"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
	"github.com/tetherfleet/tether/providers/fake"
)

// serve starts only the pool RPCs, over a real store.
func serve(t *testing.T) (*pools.Server, *admintest.Env) {
	t.Helper()
	env := admintest.New(t)
	env.Template(t, "base")
	s, err := pools.New(pools.Config{Pools: env.Services.Pools})
	if err != nil {
		t.Fatal(err)
	}
	return s, env
}

func poolNames(t *testing.T, s *pools.Server) []string {
	t.Helper()
	resp, err := s.ListPools(context.Background(), &v1.ListPoolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range resp.Pools {
		out = append(out, p.Name+"/"+p.Status.String()+"/"+p.Metadata.String())
	}
	return out
}

func TestPoolRPCs(t *testing.T) {
	s, _ := serve(t)
	ctx := admintest.As("olga", adminkit.RoleOperator)
	p, err := s.CreatePool(ctx, &v1.CreatePoolRequest{Name: "web", Template: "base", Provider: fake.Name})
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "web" || p.TemplateName != "base" || p.Status != v1.PoolStatus_POOL_STATUS_ACTIVE || p.Metadata.GetRecordRetentionDays() == 0 {
		t.Fatalf("CreatePool = %v; want an active pool over base with its defaults written out", p)
	}
	steps := []struct {
		name string
		call func() (*v1.Pool, error)
		want v1.PoolStatus
	}{
		{"get", func() (*v1.Pool, error) { return s.GetPool(ctx, &v1.GetPoolRequest{Name: "web"}) }, v1.PoolStatus_POOL_STATUS_ACTIVE},
		{"pause", func() (*v1.Pool, error) { return s.PausePool(ctx, &v1.PoolActionRequest{Name: "web"}) }, v1.PoolStatus_POOL_STATUS_PAUSED},
		{"activate", func() (*v1.Pool, error) { return s.ActivatePool(ctx, &v1.PoolActionRequest{Name: "web"}) }, v1.PoolStatus_POOL_STATUS_ACTIVE},
		{"update", func() (*v1.Pool, error) {
			return s.UpdatePool(ctx, &v1.UpdatePoolRequest{Name: "web", UpdateMask: []string{"max_size"}, MaxSize: 3})
		}, v1.PoolStatus_POOL_STATUS_ACTIVE},
	}
	for _, st := range steps {
		got, err := st.call()
		if err != nil || got.Status != st.want {
			t.Fatalf("%s = %v, %v; want status %v", st.name, got, err, st.want)
		}
	}
	if got, _ := s.GetPool(ctx, &v1.GetPoolRequest{Name: "web"}); got.MaxSize != 3 {
		t.Fatalf("max_size = %d after the update; want 3", got.MaxSize)
	}
	if _, err := s.DeletePool(ctx, &v1.PoolActionRequest{Name: "web"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetPool(ctx, &v1.GetPoolRequest{Name: "web"}); fail.Code(err) != codes.NotFound {
		t.Fatalf("GetPool after delete = %v; want NotFound", err)
	}
}

// Bad input is refused with InvalidArgument naming the field, and the
// pools are as they were.
func TestPoolRPCsRefuseBadInput(t *testing.T) {
	s, _ := serve(t)
	ctx := admintest.As("olga", adminkit.RoleOperator)
	if _, err := s.CreatePool(ctx, &v1.CreatePoolRequest{Name: "web", Template: "base", Provider: fake.Name}); err != nil {
		t.Fatal(err)
	}
	before := poolNames(t, s)
	tests := []struct {
		name  string
		call  func() error
		field string
	}{
		{"create without a template", func() error {
			_, err := s.CreatePool(ctx, &v1.CreatePoolRequest{Name: "db", Provider: fake.Name})
			return err
		}, "template"},
		{"create over a missing template", func() error {
			_, err := s.CreatePool(ctx, &v1.CreatePoolRequest{Name: "db", Template: "nope", Provider: fake.Name})
			return err
		}, "template"},
		{"create with a long name", func() error {
			_, err := s.CreatePool(ctx, &v1.CreatePoolRequest{Name: strings.Repeat("p", 200), Template: "base", Provider: fake.Name})
			return err
		}, "name"},
		{"update without a name", func() error {
			_, err := s.UpdatePool(ctx, &v1.UpdatePoolRequest{UpdateMask: []string{"max_size"}, MaxSize: 3})
			return err
		}, "name"},
		{"update naming nothing", func() error {
			_, err := s.UpdatePool(ctx, &v1.UpdatePoolRequest{Name: "web", MaxSize: 3})
			return err
		}, "update_mask"},
		{"update naming an unknown field", func() error {
			_, err := s.UpdatePool(ctx, &v1.UpdatePoolRequest{Name: "web", UpdateMask: []string{"template"}})
			return err
		}, "update_mask"},
		{"list with a negative page size", func() error {
			_, err := s.ListPools(ctx, &v1.ListPoolsRequest{PageSize: -1})
			return err
		}, "page_size"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			admintest.WantInvalid(t, err, tt.field)
			if after := poolNames(t, s); strings.Join(after, ",") != strings.Join(before, ",") {
				t.Fatalf("pools = %v after a refused call; want %v", after, before)
			}
		})
	}
}

// Without a pool service every RPC says so, rather than failing on a nil.
func TestPoolRPCsWithoutPools(t *testing.T) {
	s, err := pools.New(pools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetPool(context.Background(), &v1.GetPoolRequest{Name: "web"}); fail.Code(err) != codes.Unavailable {
		t.Fatalf("GetPool = %v; want Unavailable", err)
	}
}
