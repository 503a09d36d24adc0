package provsync_test

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
	"github.com/tetherfleet/tether/providers/external"
	"github.com/tetherfleet/tether/providers/fake"
)

type fixture struct {
	ctx    context.Context
	st     store.Store
	fake   *fake.Provider
	syncer *provsync.Syncer
	nodeID store.NodeID
	tplID  store.TemplateID
}

var t0 = instancestest.T0

func setup(t *testing.T) *fixture {
	t.Helper()
	e := instancestest.New(t, instancestest.SQLite(t), instancestest.Options{Node: "n", Timeout: 30 * time.Second})
	return &fixture{ctx: e.Ctx, st: e.Store, fake: e.Fake, nodeID: e.Node.ID, tplID: e.Template.ID,
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
		m, err := f.fake.Provision(f.ctx, providers.Spec{InstanceID: in.ID.String()})
		if err != nil {
			t.Fatal(err)
		}
		in.CloudInstanceID = m.ID
	} else {
		in.CloudInstanceID = external.IDPrefix + in.ID.String()
	}
	if err := f.st.UpdateInstance(f.ctx, in); err != nil {
		t.Fatal(err)
	}
	return in
}

func (f *fixture) get(t *testing.T, id store.InstanceID) *store.Instance {
	t.Helper()
	in, err := f.st.GetInstance(f.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func (f *fixture) events(t *testing.T, id store.InstanceID, kind store.EventKind) []*store.Event {
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
	for _, id := range []store.InstanceID{alive.ID, ext.ID} {
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

// trace records, in order, the running-row reads and provider lists a tick
// makes, as "rows <provider>" and "list <provider>".
type trace struct{ calls []string }

type tracingStore struct {
	store.Store
	tr *trace
}

func (s tracingStore) ListInstances(ctx context.Context, f store.InstanceFilter, p store.Page) ([]*store.Instance, error) {
	s.tr.calls = append(s.tr.calls, "rows "+f.Provider)
	return s.Store.ListInstances(ctx, f, p)
}

type tracingProvider struct {
	providers.Provider
	tr *trace
}

func (p tracingProvider) List(ctx context.Context) ([]providers.Machine, error) {
	p.tr.calls = append(p.tr.calls, "list "+p.Name())
	return p.Provider.List(ctx)
}

// A provider that cannot list is asked before its rows are read, so its
// rows are read only on the tick that learns it; one that lists has its
// rows read before every list, and one that starts listing goes back to
// that order, conclusions included.
func TestRowsAreReadOnlyForProvidersThatList(t *testing.T) {
	type tick struct {
		before      func(f *fixture)
		want        []string // the provider's calls, in order
		wantSkipped bool
		wantErrored int
	}
	unsupported := func(f *fixture) { f.fake.FailAlways(fake.OpList, providers.KindUnsupported) }
	listsAgain := func(f *fixture) { f.fake.ClearFailures(fake.OpList) }
	rowsThenList, listOnly := []string{"rows", "list"}, []string{"list"}
	for _, tc := range []struct {
		name, provider string
		ticks          []tick
	}{
		{"external cannot list", external.Name, []tick{
			{want: rowsThenList, wantSkipped: true},
			{want: listOnly, wantSkipped: true},
			{want: listOnly, wantSkipped: true},
		}},
		{"fake lists", fake.Name, []tick{
			{want: rowsThenList, wantErrored: 1},
			{want: rowsThenList},
		}},
		{"fake stops listing and starts again", fake.Name, []tick{
			{before: unsupported, want: rowsThenList, wantSkipped: true},
			{want: listOnly, wantSkipped: true},
			// The first list was taken before the rows: it is not used.
			{before: listsAgain, want: []string{"list", "rows", "list"}, wantErrored: 1},
			{want: rowsThenList},
		}},
		{"fake fails transiently", fake.Name, []tick{
			{before: unsupported, want: rowsThenList, wantSkipped: true},
			// Only KindUnsupported skips the rows: a transient failure
			// says nothing of the next list.
			{before: func(f *fixture) { f.fake.FailAlways(fake.OpList, providers.KindTransient) }, want: listOnly, wantSkipped: true},
			{before: listsAgain, want: rowsThenList, wantErrored: 1},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := setup(t)
			tr := &trace{}
			f.syncer.Store = tracingStore{Store: f.st, tr: tr}
			for name, p := range f.syncer.Instances.Machines {
				f.syncer.Instances.Machines[name] = tracingProvider{Provider: p, tr: tr}
			}
			// A running row whose machine vanished: errored once a list
			// shows it missing.
			lost := f.instance(t, tc.provider, lifecycle.Running)
			if tc.provider == fake.Name {
				f.fake.Vanish(lost.CloudInstanceID)
			}
			for i, tk := range tc.ticks {
				if tk.before != nil {
					tk.before(f)
				}
				tr.calls = nil
				res, _ := f.syncer.Tick(f.ctx)
				var got []string
				for _, c := range tr.calls {
					if op, p, _ := strings.Cut(c, " "); p == tc.provider {
						got = append(got, op)
					}
				}
				if !slices.Equal(got, tk.want) {
					t.Errorf("tick %d: calls %v, want %v", i+1, got, tk.want)
				}
				if slices.Contains(res.Skipped, tc.provider) != tk.wantSkipped || res.Errored != tk.wantErrored {
					t.Errorf("tick %d: result %+v, want skipped %v, errored %d", i+1, res, tk.wantSkipped, tk.wantErrored)
				}
			}
		})
	}
}
