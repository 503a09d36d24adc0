package instances_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/worker"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/testkit/instancestest"
	"github.com/tetherfleet/tether/providers/fake"
)

// env is a control plane without its API: a SQLite store, a fake
// provider, a fake clock and a worker the test drives by hand.
type env struct {
	t    *testing.T
	ctx  context.Context
	st   store.Store
	clk  *clock.Fake
	fake *fake.Provider
	svc  *instances.Service
	wk   *worker.Worker
	node *store.Node
	logs *instancestest.LogBuffer
}

var t0 = instancestest.T0

func newEnv(t *testing.T) *env {
	t.Helper()
	f := instancestest.New(t, instancestest.SQLite(t), instancestest.Options{Owner: "api-test", KernelArgs: "quiet", Node: "n1"})
	return &env{t: t, ctx: f.Ctx, st: f.Store, clk: f.Clock, fake: f.Fake, svc: f.Instances, wk: f.Worker, node: f.Node, logs: f.Logs}
}

// provision provisions on the fake provider and runs the worker once.
func (e *env) provision() *store.Instance {
	e.t.Helper()
	res, err := e.svc.Provision(e.ctx, instances.ProvisionParams{Node: e.node.Name, Provider: fake.Name})
	if err != nil {
		e.t.Fatal(err)
	}
	if ran, err := e.wk.RunOnce(e.ctx); !ran || err != nil {
		e.t.Fatalf("worker ran %v: %v", ran, err)
	}
	return e.get(res.Instance.ID)
}

// running provisions and reports the agent ready.
func (e *env) running() *store.Instance {
	e.t.Helper()
	in := e.provision()
	if err := e.svc.AgentReady(e.ctx, in.ID); err != nil {
		e.t.Fatal(err)
	}
	in = e.get(in.ID)
	if in.Status != lifecycle.Running {
		e.t.Fatalf("instance is %s, want running", in.Status)
	}
	return in
}

func (e *env) get(id store.InstanceID) *store.Instance {
	e.t.Helper()
	in, err := e.st.GetInstance(e.ctx, id)
	if err != nil {
		e.t.Fatal(err)
	}
	return in
}

func (e *env) setStatus(id store.InstanceID, st lifecycle.State) {
	e.t.Helper()
	in := e.get(id)
	in.Status = st
	if err := e.st.UpdateInstance(e.ctx, in); err != nil {
		e.t.Fatal(err)
	}
}

// eventKinds lists an instance's event kinds, oldest first.
func (e *env) eventKinds(id store.InstanceID) []store.EventKind {
	e.t.Helper()
	evs, err := e.st.ListEvents(e.ctx, store.EventFilter{InstanceID: id}, store.Page{Limit: store.MaxPageSize})
	if err != nil {
		e.t.Fatal(err)
	}
	out := make([]store.EventKind, len(evs))
	for i, ev := range evs {
		out[len(evs)-1-i] = ev.Kind
	}
	return out
}

func (e *env) hasEvent(id store.InstanceID, kind store.EventKind) bool {
	for _, k := range e.eventKinds(id) {
		if k == kind {
			return true
		}
	}
	return false
}

func (e *env) tasks(id store.InstanceID) []*store.Task {
	e.t.Helper()
	ts, err := e.st.ListTasks(e.ctx, store.TaskFilter{InstanceID: id}, store.Page{Limit: store.MaxPageSize})
	if err != nil {
		e.t.Fatal(err)
	}
	return ts
}

// openTasks are the instance's tasks that have not ended.
func (e *env) openTasks(id store.InstanceID) int {
	n := 0
	for _, t := range e.tasks(id) {
		if !t.Terminal() {
			n++
		}
	}
	return n
}

// noTokenInLogs fails if anything logged carries a bootstrap token.
func (e *env) noTokenInLogs() {
	e.t.Helper()
	if strings.Contains(e.logs.String(), "tbt_") {
		e.t.Fatalf("a bootstrap token was logged:\n%s", e.logs.String())
	}
}

func wantCode(t *testing.T, err error, want codes.Code) {
	t.Helper()
	if got := fail.Code(err); got != want || (err == nil) != (want == codes.OK) {
		t.Fatalf("got %v (%v), want %v", got, err, want)
	}
}

func isTransitionErr(err error) bool {
	var te *lifecycle.TransitionError
	return errors.As(err, &te)
}
