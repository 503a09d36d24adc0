package wire_test

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/daemon/wire"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/pki/ca"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/fake"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func deps(t *testing.T) wire.Deps {
	t.Helper()
	dir := t.TempDir()
	clk := clock.NewFake(t0)
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "t.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	authority, err := ca.Create(filepath.Join(dir, "ca"), "wire-test", clk)
	if err != nil {
		t.Fatal(err)
	}
	blobs, err := modules.OpenBlobs(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	return wire.Deps{Store: st, Clock: clk, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Machines: map[string]providers.Provider{fake.Name: fake.New(fake.WithClock(clk))},
		CA:       authority, Blobs: blobs, AgentURL: "https://10.0.2.2:7443", NetbootURL: "http://10.0.2.2:8080/",
		Replica: "replica-a", Tuning: wire.Tuning{Owner: "api-owner", WorkerOwner: "worker-owner"}}
}

// A missing dependency is named, and nothing is built: a service built
// over a nil store or CA would fail only on its first use.
func TestNewServicesNamesWhatIsMissing(t *testing.T) {
	tests := []struct {
		name   string
		remove func(*wire.Deps)
		want   string
	}{
		{"store", func(d *wire.Deps) { d.Store = nil }, "Deps.Store"},
		{"clock", func(d *wire.Deps) { d.Clock = nil }, "Deps.Clock"},
		{"log", func(d *wire.Deps) { d.Log = nil }, "Deps.Log"},
		{"machines", func(d *wire.Deps) { d.Machines = nil }, "Deps.Machines"},
		{"CA", func(d *wire.Deps) { d.CA = nil }, "Deps.CA"},
		{"blobs", func(d *wire.Deps) { d.Blobs = nil }, "Deps.Blobs"},
		{"agent URL", func(d *wire.Deps) { d.AgentURL = "" }, "Deps.AgentURL"},
		{"two at once", func(d *wire.Deps) { d.CA, d.Blobs = nil, nil }, "Deps.CA, Deps.Blobs"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := deps(t)
			tc.remove(&d)
			s, err := wire.NewServices(d)
			if err == nil || !strings.Contains(err.Error(), tc.want) || s != nil {
				t.Fatalf("NewServices = %v, %v; want an error naming %s", s, err, tc.want)
			}
		})
	}
}

// Each service is handed the ones it uses at construction, and they are
// the very services NewServices returns: nothing is patched in later.
func TestNewServicesWiresOneGraph(t *testing.T) {
	d := deps(t)
	s, err := wire.NewServices(d)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		what string
		ok   bool
	}{
		{"the pools hear the instance service's nudges", s.Instances.Pools == instances.PoolEvents(s.Pools.Nudges) && s.Pools.Nudges != nil},
		{"the pools drive the instance service", s.Pools.Instances == s.Instances},
		{"liveness judges through the instance service", s.Liveness.Instances == s.Instances},
		{"provider sync acts through the instance service", s.Sync.Instances == s.Instances},
		{"death checks ask provider sync", s.Checks.Syncer == s.Sync},
		{"the worker runs the instance service's operations", len(s.Worker.Handlers) > 0 && len(s.Worker.Handlers) == len(s.Instances.Handlers())},
		{"boots get the CA's fingerprint", s.Instances.CAFingerprint == d.CA.Fingerprint()},
		{"enrollment signs with the CA", s.Enroll.CA == d.CA},
		{"presence names this replica", s.Presence.Replica == "replica-a"},
		{"owners are the tuned ones", s.Instances.Owner == "api-owner" && s.Worker.Owner == "worker-owner"},
		{"artifacts are fetched from the netboot URL", s.Instances.Artifacts.BaseURL == "http://10.0.2.2:8080"},
		{"a dropped stream waits before the provider is asked", s.Sync.StreamLostConfirm == wire.DefaultStreamLostConfirm},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("%s: not so", c.what)
		}
	}
	// The queue is shared, not merely of the same type: a member leaving
	// through the instance service reaches the pool service.
	s.Instances.Pools.MemberLeft("")
	if n := s.Pools.ServeNudges(context.Background()); n != 1 {
		t.Fatalf("the pool service served %d nudges after a member left, want 1", n)
	}
}

// Without tuning, each replica gets owners of its own.
func TestNewServicesDefaultOwners(t *testing.T) {
	d := deps(t)
	d.Tuning = wire.Tuning{}
	a, err := wire.NewServices(d)
	if err != nil {
		t.Fatal(err)
	}
	b, err := wire.NewServices(d)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(a.Instances.Owner, "tetherd-api:") || !strings.HasPrefix(a.Worker.Owner, "tetherd-worker:") || a.Instances.Owner == b.Instances.Owner {
		t.Fatalf("owners %q, %q and %q: want fresh tetherd-api and tetherd-worker owners", a.Instances.Owner, a.Worker.Owner, b.Instances.Owner)
	}
}
