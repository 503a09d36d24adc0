// Package admintest builds what one admin resource's tests need and no
// more: the services over a fresh SQLite store in a temporary directory
// (wire.NewServices, as tetherd builds them, with the fake provider), and
// contexts carrying an admin identity of each role, as the auth
// interceptor would. A resource's tests call its handlers directly; no
// daemon, listener or other resource is started.
package admintest

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/api/admin/adminkit"
	"github.com/tetherfleet/tether/controlplane/daemon/wire"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/pki"
	"github.com/tetherfleet/tether/pki/ca"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/fake"
)

// T0 is the fake clock's start.
var T0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// Env is one resource test's world.
type Env struct {
	Store    store.Store
	Clock    *clock.Fake
	CA       *ca.CA
	Services *wire.Services
	Log      *slog.Logger
}

// New opens a store in t's temporary directory and builds the services
// over it.
func New(t *testing.T) *Env {
	t.Helper()
	dir := t.TempDir()
	clk := clock.NewFake(T0)
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	authority, err := ca.Create(filepath.Join(dir, "ca"), "admintest", clk)
	if err != nil {
		t.Fatal(err)
	}
	blobs, err := modules.OpenBlobs(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	// The default boot artifacts an instance's provisioning names.
	kernel, _, err := blobs.Ingest(strings.NewReader("a kernel"), false)
	if err != nil {
		t.Fatal(err)
	}
	initrd, _, err := blobs.Ingest(strings.NewReader("an initramfs"), false)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := wire.NewServices(wire.Deps{Store: st, Clock: clk, Log: log, Kernel: kernel, Initramfs: initrd,
		Machines: map[string]providers.Provider{fake.Name: fake.New(fake.WithClock(clk))},
		CA:       authority, Blobs: blobs, AgentURL: "https://127.0.0.1:7443", NetbootURL: "http://127.0.0.1:8080/"})
	if err != nil {
		t.Fatal(err)
	}
	return &Env{Store: st, Clock: clk, CA: authority, Services: svc, Log: log}
}

// As is a context whose caller is the admin identity name with role.
func As(name string, role store.Role) context.Context {
	return adminkit.WithCaller(context.Background(), adminkit.Caller{
		Identity: pki.Identity{Kind: pki.KindAdmin, Name: name, Role: role.String()}, Serial: store.CertSerial("serial-" + name),
		NotAfter: T0.Add(24 * time.Hour)})
}

// Template creates a template named name with no modules.
func (e *Env) Template(t *testing.T, name string) *store.Template {
	t.Helper()
	tpl := &store.Template{Name: name}
	if err := e.Services.Catalog.CreateTemplate(context.Background(), tpl, nil); err != nil {
		t.Fatal(err)
	}
	return tpl
}

// Instance creates a template, a node over it and an instance of the node
// on the fake provider (its provisioning left queued for a worker the
// test does not run).
func (e *Env) Instance(t *testing.T, node string) *store.Instance {
	t.Helper()
	ctx := context.Background()
	e.Template(t, node+"-tpl")
	if _, err := e.Services.Catalog.CreateNode(ctx, &store.Node{Name: node, Enabled: true}, node+"-tpl"); err != nil {
		t.Fatal(err)
	}
	res, err := e.Services.Instances.Provision(ctx, instances.ProvisionParams{Node: node, Provider: fake.Name})
	if err != nil {
		t.Fatal(err)
	}
	return res.Instance
}

// Module records a module row (no blob: enough for a template to name it).
func (e *Env) Module(t *testing.T, name, version string) *store.Module {
	t.Helper()
	m := &store.Module{Name: name, Version: version, Digest: "sha256:" + strings.Repeat("ab", 32), Size: 4096, CreatedAt: T0}
	if err := e.Store.CreateModule(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	return m
}

// WantInvalid fails t unless err is InvalidArgument and its message starts
// with the field it names ("field: ..."), as every admin refusal of bad
// input does.
func WantInvalid(t *testing.T, err error, field string) {
	t.Helper()
	if fail.Code(err) != codes.InvalidArgument || !strings.HasPrefix(status.Convert(err).Message(), field+":") {
		t.Fatalf("err = %v; want InvalidArgument naming %s", err, field)
	}
}
