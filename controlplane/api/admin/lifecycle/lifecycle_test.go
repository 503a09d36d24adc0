package lifecycle_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/tetherfleet/tether/controlplane/api/admin/adminkit"
	"github.com/tetherfleet/tether/controlplane/api/admin/lifecycle"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/testkit/admintest"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// serve starts only the instance actions, over a real store, with one
// instance of node n1.
func serve(t *testing.T) (*lifecycle.Server, *admintest.Env, string) {
	t.Helper()
	env := admintest.New(t)
	in := env.Instance(t, "n1")
	s, err := lifecycle.New(lifecycle.Config{Instances: env.Services.Instances, Reads: env.Store, Clock: env.Clock})
	if err != nil {
		t.Fatal(err)
	}
	return s, env, in.ID.String()
}

// state is what a refused call must leave as it was.
func state(t *testing.T, env *admintest.Env, id string) string {
	t.Helper()
	in, err := env.Store.GetInstance(context.Background(), store.InstanceID(id))
	if err != nil {
		t.Fatal(err)
	}
	return string(in.Status) + "/" + in.HoldReason + "/" + in.UpdatedAt.String()
}

func TestInstanceActions(t *testing.T) {
	s, _, id := serve(t)
	ctx := admintest.As("olga", adminkit.RoleOperator)
	got, err := s.HoldInstance(ctx, &v1.HoldInstanceRequest{Id: id, Reason: "disk swap"})
	if err != nil || !got.Hold || got.HoldReason != "disk swap" || got.NodeName != "n1" {
		t.Fatalf("HoldInstance = %v, %v; want n1's instance held for the reason given", got, err)
	}
	if _, err := s.RebootInstance(ctx, &v1.InstanceActionRequest{Id: id}); fail.Code(err) != codes.FailedPrecondition {
		t.Fatalf("RebootInstance of a held instance = %v; want FailedPrecondition", err)
	}
	got, err = s.UnholdInstance(ctx, &v1.InstanceActionRequest{Id: id})
	if err != nil || got.Hold {
		t.Fatalf("UnholdInstance = %v, %v; want the hold gone", got, err)
	}
}

func TestInstanceActionsRefuseBadInput(t *testing.T) {
	s, env, id := serve(t)
	ctx := admintest.As("olga", adminkit.RoleOperator)
	before := state(t, env, id)
	tests := []struct {
		name  string
		call  func() error
		field string
	}{
		{"hold without a reason", func() error {
			_, err := s.HoldInstance(ctx, &v1.HoldInstanceRequest{Id: id})
			return err
		}, "reason"},
		{"hold naming no instance", func() error {
			_, err := s.HoldInstance(ctx, &v1.HoldInstanceRequest{Reason: "why"})
			return err
		}, "id"},
		{"cordon with a long reason", func() error {
			_, err := s.CordonInstance(ctx, &v1.CordonInstanceRequest{Id: id, Reason: strings.Repeat("r", 2000)})
			return err
		}, "reason"},
		{"drain without a reason", func() error {
			_, err := s.DrainInstance(ctx, &v1.DrainInstanceRequest{Id: id})
			return err
		}, "reason"},
		{"console with a negative tail", func() error {
			return s.GetInstanceConsole(&v1.GetInstanceConsoleRequest{Id: id, TailBytes: -1}, nil)
		}, "tail_bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			admintest.WantInvalid(t, err, tt.field)
			if after := state(t, env, id); after != before {
				t.Fatalf("instance = %s after a refused call; want %s", after, before)
			}
		})
	}
}

func TestNewNamesWhatIsMissing(t *testing.T) {
	if _, err := lifecycle.New(lifecycle.Config{}); err == nil || !strings.Contains(err.Error(), "Config.Instances") {
		t.Fatalf("New = %v; want the missing Instances named", err)
	}
}
