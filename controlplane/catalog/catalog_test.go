package catalog_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/tetherfleet/tether/controlplane/catalog"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/internal/clock"
)

func newService(t *testing.T) (*catalog.Service, *clock.Fake) {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	clk := clock.NewFake(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	return &catalog.Service{Store: st, Clock: clk}, clk
}

// The writes the API used to make itself: each stamps its times, and a
// store refusal comes back with the code the API answers with.
func TestCatalogWrites(t *testing.T) {
	ctx := context.Background()
	s, clk := newService(t)
	t0 := clk.Now()
	if err := s.CreateTemplate(ctx, &store.Template{Name: "base"}, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateTemplate(ctx, &store.Template{Name: "base"}, nil); fail.Code(err) != codes.AlreadyExists {
		t.Fatalf("a second template base: %v", err)
	}
	n := &store.Node{Name: "n1", Enabled: true, Config: []byte("{}")}
	tpl, err := s.CreateNode(ctx, n, "base")
	if err != nil || tpl.Name != "base" || n.TemplateID != tpl.ID || !n.CreatedAt.Equal(t0) {
		t.Fatalf("CreateNode = %+v, %v (node %+v)", tpl, err, n)
	}
	tests := []struct {
		name string
		err  error
		code codes.Code
	}{
		{"node on a missing template", func() error { _, err := s.CreateNode(ctx, &store.Node{Name: "n2"}, "nope"); return err }(), codes.InvalidArgument},
		{"a second node n1", func() error { _, err := s.CreateNode(ctx, &store.Node{Name: "n1"}, "base"); return err }(), codes.AlreadyExists},
		{"update of a missing node", func() error {
			_, err := s.UpdateNode(ctx, "ghost", func(store.Queries, *store.Node) error { return nil })
			return err
		}(), codes.NotFound},
		{"a refused update writes nothing", func() error {
			_, err := s.UpdateNode(ctx, "n1", func(_ store.Queries, n *store.Node) error {
				n.Enabled = false
				return fail.Invalid("config", "bad")
			})
			return err
		}(), codes.InvalidArgument},
		{"template in use", s.DeleteTemplate(ctx, "base"), codes.FailedPrecondition},
	}
	for _, tc := range tests {
		if got := fail.Code(tc.err); got != tc.code {
			t.Errorf("%s: %v (%v), want %v", tc.name, got, tc.err, tc.code)
		}
	}
	if got, err := s.Store.GetNode(ctx, "n1"); err != nil || !got.Enabled {
		t.Fatalf("the refused update was written: %+v, %v", got, err)
	}
	clk.Advance(time.Minute)
	got, err := s.UpdateTemplate(ctx, "base", func(_ store.Queries, t *store.Template) error { t.KernelArgs = "quiet"; return nil })
	if err != nil || got.KernelArgs != "quiet" || !got.UpdatedAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("UpdateTemplate = %+v, %v", got, err)
	}
	if err := s.DeleteNode(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTemplate(ctx, "base"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Store.GetTemplate(ctx, "base"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("template still there: %v", err)
	}
}
