package libvirt_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/provsync"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/testkit/instancestest"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/libvirt"
	"github.com/tetherfleet/tether/providers/libvirt/libvirttest"
	"github.com/tetherfleet/tether/providers/qemu/qemutest"
)

// TestRealLibvirtProviderSync runs the provider-sync loop against a real
// libvirtd: a domain whose instance row is terminated (an orphan) is
// reported and destroyed, a running row whose domain is gone goes to
// error, and a tagged domain of an instance this control plane does not
// know is left alone (it may be another control plane's).
func TestRealLibvirtProviderSync(t *testing.T) {
	d := libvirttest.Start(t)
	kernel := qemutest.FetchKernel(t)
	initrd := qemutest.TinyInitramfs(t, kernel)
	p, err := libvirt.New(libvirt.Config{URI: d.URI, StateDir: d.StateDir, FileOwner: d.Owner, StopGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	e := instancestest.New(t, instancestest.SQLite(t), instancestest.Options{Node: "n", Timeout: 3 * time.Minute})
	e.Instances.Machines[libvirt.Name] = p
	syncer := &provsync.Syncer{Store: e.Store, Clock: e.Clock, Log: e.Log, Instances: e.Instances}
	ctx := e.Ctx
	boot := providers.Boot{KernelPath: kernel.Path, InitramfsPath: initrd,
		Enrollment: providers.Enrollment{ControlPlaneURL: "https://10.0.2.2:7443", Token: "sync-token-" + strings.Repeat("s", 32)}}

	row := func(status lifecycle.State, withDomain bool) *store.Instance {
		t.Helper()
		in := &store.Instance{NodeID: e.Node.ID, Status: status, Provider: libvirt.Name, CreatedAt: instancestest.T0, UpdatedAt: instancestest.T0}
		if err := e.Store.CreateInstance(ctx, in); err != nil {
			t.Fatal(err)
		}
		in.CloudInstanceID = in.ID.String()
		if withDomain {
			if _, err := p.Provision(ctx, providers.Spec{InstanceID: in.ID.String(), Boot: boot}); err != nil {
				t.Fatalf("provision %s: %v", in.ID, err)
			}
		}
		if err := e.Store.UpdateInstance(ctx, in); err != nil {
			t.Fatal(err)
		}
		return in
	}
	alive := row(lifecycle.Running, true)
	orphan := row(lifecycle.Terminated, true)
	lost := row(lifecycle.Running, false)
	const stranger = "0f0f0f0f-0000-4000-8000-000000000001"
	if _, err := p.Provision(ctx, providers.Spec{InstanceID: stranger, Boot: boot}); err != nil {
		t.Fatal(err)
	}

	res, err := syncer.Tick(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.GuestsPresent != 1 || res.Destroyed != 1 || res.Errored != 1 || slices.Contains(res.Skipped, libvirt.Name) {
		t.Fatalf("sync result %+v", res)
	}
	names := d.DomainNames(t)
	slices.Sort(names)
	want := []string{libvirt.DomainName(stranger), libvirt.DomainName(alive.ID.String())}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("domains after sync = %v, want %v (the orphan destroyed)", names, want)
	}
	evs, err := e.Store.ListEvents(ctx, store.EventFilter{InstanceID: orphan.ID, Kind: events.InstanceGuestPresent}, store.Page{Limit: 10})
	if err != nil || len(evs) != 1 || evs[0].Severity != events.High {
		t.Fatalf("guest-present events = %+v, %v", evs, err)
	}
	got, err := e.Store.GetInstance(ctx, lost.ID)
	if err != nil || got.Status != lifecycle.Error || !strings.Contains(got.ErrorMessage, "machine gone") {
		t.Fatalf("lost row = %+v, %v", got, err)
	}
	if got, _ := e.Store.GetInstance(ctx, alive.ID); got.Status != lifecycle.Running {
		t.Fatalf("the live row went %s", got.Status)
	}
	if !strings.Contains(e.Logs.String(), "does not know") {
		t.Fatalf("the stranger's domain was not reported in the log:\n%s", e.Logs.String())
	}
	// The orphan is gone: the next sync is quiet.
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if res, err := syncer.Tick(cctx); err != nil || res.GuestsPresent != 0 || res.Errored != 0 {
		t.Fatalf("second sync %+v, %v", res, err)
	}
}
