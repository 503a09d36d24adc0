// Package instancestest is the fixture the instance, pool, liveness and
// provider-sync tests share: the services built by wire.NewServices, as
// tetherd builds them, over a store the test chooses, with a fake
// provider, a fake clock and a worker the test drives by hand.
package instancestest

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/daemon/wire"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/controlplane/worker"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/testkit/logbuf"
	"github.com/tetherfleet/tether/pki/ca"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/external"
	"github.com/tetherfleet/tether/providers/fake"
)

// T0 is where every fixture's clock starts.
var T0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// Options vary the fixture.
type Options struct {
	// Owner names the service's worker-task owner (default "test").
	Owner string
	// ProvisionAttempts bounds provider retries (zero: the service default).
	ProvisionAttempts int
	// KernelArgs go on the template.
	KernelArgs string
	// Node, when set, creates a node of that name on the template.
	Node string
	// Timeout bounds the fixture's context (default 60 s).
	Timeout time.Duration
}

// Env is the wired services and what they run on.
type Env struct {
	Ctx   context.Context
	Store store.Store
	Clock *clock.Fake
	Fake  *fake.Provider
	// Services are every service, built as tetherd builds them; the
	// instance service and its worker are also below by name.
	Services  *wire.Services
	Instances *instances.Service
	Worker    *worker.Worker
	Template  *store.Template
	Node      *store.Node // nil unless Options.Node
	Logs      *LogBuffer
	Log       *slog.Logger
}

// SQLite opens a fresh SQLite store in a temp dir.
func SQLite(t testing.TB) store.Store {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// New builds the services over st.
func New(t testing.TB, st store.Store, o Options) *Env {
	t.Helper()
	if o.Owner == "" {
		o.Owner = "test"
	}
	if o.Timeout == 0 {
		o.Timeout = 60 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.Timeout)
	t.Cleanup(cancel)
	blobs, err := modules.OpenBlobs(filepath.Join(t.TempDir(), "blobs"))
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
	clk := clock.NewFake(T0)
	logs := &LogBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	authority, err := ca.Create(filepath.Join(t.TempDir(), "ca"), "instancestest", clk)
	if err != nil {
		t.Fatal(err)
	}
	fp := fake.New(fake.WithClock(clk))
	svcs, err := wire.NewServices(wire.Deps{Store: st, Clock: clk, Log: log,
		Machines: map[string]providers.Provider{fake.Name: fp, external.Name: external.New()},
		CA:       authority, Blobs: blobs, AgentURL: "https://10.0.2.2:7443",
		Kernel: kernel, Initramfs: initrd, NetbootURL: "http://10.0.2.2:8080", Replica: "instancestest",
		Tuning: wire.Tuning{Owner: o.Owner, WorkerOwner: "worker-test",
			RetryBackoff: time.Millisecond, OpTimeout: 10 * time.Second, ProvisionAttempts: o.ProvisionAttempts}})
	if err != nil {
		t.Fatal(err)
	}
	e := &Env{Ctx: ctx, Store: st, Clock: clk, Fake: fp, Services: svcs, Instances: svcs.Instances, Worker: svcs.Worker, Logs: logs, Log: log}
	e.Template = &store.Template{Name: "tpl", KernelArgs: o.KernelArgs, CreatedAt: T0, UpdatedAt: T0}
	if err := st.CreateTemplate(ctx, e.Template); err != nil {
		t.Fatal(err)
	}
	if o.Node != "" {
		e.Node = &store.Node{Name: o.Node, TemplateID: e.Template.ID, Enabled: true, Config: []byte("{}"), CreatedAt: T0, UpdatedAt: T0}
		if err := st.CreateNode(ctx, e.Node); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// LogBuffer collects log output from concurrent goroutines.
type LogBuffer = logbuf.Buffer
