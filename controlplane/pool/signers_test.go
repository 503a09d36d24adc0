package pool_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/testkit/instancestest"
)

// A pool whose template requires signers never warms a member that would
// refuse its root: the replenish provisions nothing and says why.
func TestReplenishRefusesUnsignedModules(t *testing.T) {
	e := newEnv(t, instancestest.SQLite)
	must(t, e.st.CreateModule(e.ctx, &store.Module{Name: "base", Version: "1", Digest: "sha256:" + strings.Repeat("0", 64), Size: 1, CreatedAt: t0}))
	tpl, err := e.st.GetTemplate(e.ctx, e.tpl.Name)
	must(t, err)
	fp := "sha256:" + strings.Repeat("cd", 32)
	tpl.RootModules, tpl.RequiredSigners = []store.ModuleRef{{Name: "base", Version: "1"}}, []string{fp}
	must(t, e.st.Tx(e.ctx, func(q store.Queries) error { return q.UpdateTemplate(e.ctx, tpl) }))
	p := e.create("ci", 2, store.PoolMetadata{})
	_, r, err := e.svc.Replenish(e.ctx, "ci")
	if err == nil {
		err = r.Err
	}
	if r.Provisioned != 0 || status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "base:1") || !strings.Contains(err.Error(), fp) {
		t.Fatalf("replenish = %+v (%v), want nothing provisioned and the unsigned module named", r, err)
	}
	if n := len(e.members(p)); n != 0 {
		t.Fatalf("%d members warmed", n)
	}
}
