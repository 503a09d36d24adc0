package instances_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/controlplane/worker"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/external"
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
	logs *syncBuffer
}

// syncBuffer collects log output from concurrent goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	dir := t.TempDir()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	blobs, err := modules.OpenBlobs(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	kernel, _, err := blobs.Ingest(strings.NewReader("a kernel"), false)
	if err != nil {
		t.Fatal(err)
	}
	initrd, _, err := blobs.Ingest(strings.NewReader("an initramfs"), false)
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(t0)
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	fp := fake.New(fake.WithClock(clk))
	svc := &instances.Service{Store: st, Clock: clk, Log: log,
		Machines:  map[string]providers.Provider{fake.Name: fp, external.Name: external.New()},
		Artifacts: &instances.Artifacts{Blobs: blobs, Kernel: kernel, Initramfs: initrd, BaseURL: "http://10.0.2.2:8080"},
		AgentURL:  "https://10.0.2.2:7443", CAFingerprint: "sha256:" + strings.Repeat("ab", 32),
		Owner: "api-test", RetryBackoff: time.Millisecond, OpTimeout: 10 * time.Second}
	wk := &worker.Worker{Store: st, Clock: clk, Log: log, Owner: "worker-test", Handlers: svc.Handlers()}
	tpl := &store.Template{Name: "tpl", KernelArgs: "quiet", CreatedAt: t0, UpdatedAt: t0}
	if err := st.CreateTemplate(ctx, tpl); err != nil {
		t.Fatal(err)
	}
	node := &store.Node{Name: "n1", TemplateID: tpl.ID, Enabled: true, Config: []byte("{}"), CreatedAt: t0, UpdatedAt: t0}
	if err := st.CreateNode(ctx, node); err != nil {
		t.Fatal(err)
	}
	return &env{t: t, ctx: ctx, st: st, clk: clk, fake: fp, svc: svc, wk: wk, node: node, logs: logs}
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
	if in.Status != string(lifecycle.Running) {
		e.t.Fatalf("instance is %s, want running", in.Status)
	}
	return in
}

func (e *env) get(id string) *store.Instance {
	e.t.Helper()
	in, err := e.st.GetInstance(e.ctx, id)
	if err != nil {
		e.t.Fatal(err)
	}
	return in
}

func (e *env) setStatus(id string, st lifecycle.State) {
	e.t.Helper()
	in := e.get(id)
	in.Status = string(st)
	if err := e.st.UpdateInstance(e.ctx, in); err != nil {
		e.t.Fatal(err)
	}
}

// eventKinds lists an instance's event kinds, oldest first.
func (e *env) eventKinds(id string) []string {
	e.t.Helper()
	evs, err := e.st.ListEvents(e.ctx, store.EventFilter{InstanceID: id}, store.Page{Limit: store.MaxPageSize})
	if err != nil {
		e.t.Fatal(err)
	}
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[len(evs)-1-i] = ev.Kind
	}
	return out
}

func (e *env) hasEvent(id, kind string) bool {
	for _, k := range e.eventKinds(id) {
		if k == kind {
			return true
		}
	}
	return false
}

func (e *env) tasks(id string) []*store.Task {
	e.t.Helper()
	ts, err := e.st.ListTasks(e.ctx, store.TaskFilter{InstanceID: id}, store.Page{Limit: store.MaxPageSize})
	if err != nil {
		e.t.Fatal(err)
	}
	return ts
}

// openTasks are the instance's tasks that have not ended.
func (e *env) openTasks(id string) int {
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
