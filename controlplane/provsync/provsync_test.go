package provsync_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/instances/instancestest"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/provsync"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/external"
	"github.com/tetherfleet/tether/providers/fake"
)

type fixture struct {
	ctx    context.Context
	st     store.Store
	fake   *fake.Provider
	syncer *provsync.Syncer
	nodeID string
}

var t0 = instancestest.T0

func setup(t *testing.T) *fixture {
	t.Helper()
	e := instancestest.New(t, instancestest.SQLite(t), instancestest.Options{Node: "n", Timeout: 30 * time.Second})
	return &fixture{ctx: e.Ctx, st: e.Store, fake: e.Fake, nodeID: e.Node.ID,
		syncer: &provsync.Syncer{Store: e.Store, Clock: e.Clock, Log: e.Log, Instances: e.Instances}}
}

// instance adds an instance in status with a machine on provider.
func (f *fixture) instance(t *testing.T, provider string, status lifecycle.State) *store.Instance {
	t.Helper()
	in := &store.Instance{NodeID: f.nodeID, Status: status, Provider: provider, CreatedAt: t0, UpdatedAt: t0}
	if err := f.st.CreateInstance(f.ctx, in); err != nil {
		t.Fatal(err)
	}
	if provider == fake.Name {
		m, err := f.fake.Provision(f.ctx, providers.Spec{InstanceID: in.ID})
		if err != nil {
			t.Fatal(err)
		}
		in.CloudInstanceID = m.ID
	} else {
		in.CloudInstanceID = external.IDPrefix + in.ID
	}
	if err := f.st.UpdateInstance(f.ctx, in); err != nil {
		t.Fatal(err)
	}
	return in
}

func (f *fixture) get(t *testing.T, id string) *store.Instance {
	t.Helper()
	in, err := f.st.GetInstance(f.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func (f *fixture) events(t *testing.T, id, kind string) []*store.Event {
	t.Helper()
	evs, err := f.st.ListEvents(f.ctx, store.EventFilter{InstanceID: id, Kind: kind}, store.Page{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

func TestRunningRowWithoutAMachineGoesToError(t *testing.T) {
	f := setup(t)
	alive := f.instance(t, fake.Name, lifecycle.Running)
	lost := f.instance(t, fake.Name, lifecycle.Running)
	ext := f.instance(t, external.Name, lifecycle.Running)
	f.fake.Vanish(lost.CloudInstanceID)
	res, err := f.syncer.Tick(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Errored != 1 || !slices.Contains(res.Skipped, external.Name) {
		t.Fatalf("result %+v", res)
	}
	if got := f.get(t, lost.ID); got.Status != lifecycle.Error || got.ErrorMessage == "" {
		t.Fatalf("lost machine's row: %s %q", got.Status, got.ErrorMessage)
	}
	if len(f.events(t, lost.ID, events.InstanceErrored)) != 1 {
		t.Fatal("no event for the errored row")
	}
	// The live machine's row and the external one (whose provider cannot
	// list) are left alone.
	for _, id := range []string{alive.ID, ext.ID} {
		if got := f.get(t, id); got.Status != lifecycle.Running {
			t.Fatalf("%s went %s", id, got.Status)
		}
	}
}

func TestTerminatedRowWithAGuestIsReportedAndDestroyed(t *testing.T) {
	f := setup(t)
	in := f.instance(t, fake.Name, lifecycle.Terminated)
	res, err := f.syncer.Tick(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.GuestsPresent != 1 || res.Destroyed != 1 || len(f.fake.Machines()) != 0 {
		t.Fatalf("result %+v, %d machines", res, len(f.fake.Machines()))
	}
	evs := f.events(t, in.ID, events.InstanceGuestPresent)
	if len(evs) != 1 || evs[0].Severity != events.High {
		t.Fatalf("events %+v", evs)
	}
	// It is gone now: the next sync is quiet.
	if res, _ := f.syncer.Tick(f.ctx); res.GuestsPresent != 0 {
		t.Fatalf("second sync %+v", res)
	}
}

func TestGuestThatCannotBeDestroyedIsReportedAgain(t *testing.T) {
	f := setup(t)
	in := f.instance(t, fake.Name, lifecycle.Terminated)
	f.fake.FailAlways(fake.OpTerminate, providers.KindTransient)
	for range 2 {
		if res, _ := f.syncer.Tick(f.ctx); res.GuestsPresent != 1 || res.Destroyed != 0 {
			t.Fatalf("result %+v", res)
		}
	}
	if n := len(f.events(t, in.ID, events.InstanceGuestPresent)); n != 2 {
		t.Fatalf("%d events for a guest that stays", n)
	}
}

// A provider whose list fails gives no grounds to error anything.
func TestListFailureConcludesNothing(t *testing.T) {
	f := setup(t)
	in := f.instance(t, fake.Name, lifecycle.Running)
	f.fake.Vanish(in.CloudInstanceID)
	f.fake.FailAlways(fake.OpList, providers.KindTransient)
	res, err := f.syncer.Tick(f.ctx)
	if err == nil || res.Errored != 0 {
		t.Fatalf("%+v %v", res, err)
	}
	if got := f.get(t, in.ID); got.Status != lifecycle.Running {
		t.Fatalf("errored on a failed list: %s", got.Status)
	}
}
