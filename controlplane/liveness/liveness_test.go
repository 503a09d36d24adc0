package liveness_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/liveness"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/testkit/instancestest"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/fake"
)

func TestTTL(t *testing.T) {
	tests := []struct {
		name  string
		min   time.Duration
		n     int
		rate  float64
		grace time.Duration
		want  time.Duration
	}{
		{"small fleet: the minimum", 3 * time.Minute, 100, 2000, 0, 3 * time.Minute},
		{"grace is added", 3 * time.Minute, 100, 2000, 15 * time.Second, 3*time.Minute + 15*time.Second},
		{"a fleet past min*rate stretches it", 3 * time.Minute, 1_000_000, 2000, 0, 500 * time.Second},
		{"exactly at the knee", 3 * time.Minute, 360_000, 2000, 0, 3 * time.Minute},
		{"zero rate falls back to the default", 3 * time.Minute, 2_000_000, 0, 0, 1000 * time.Second},
	}
	for _, tc := range tests {
		if got := liveness.TTL(tc.min, tc.n, tc.rate, tc.grace); got != tc.want {
			t.Errorf("%s: TTL = %v, want %v", tc.name, got, tc.want)
		}
	}
}

type fixture struct {
	ctx    context.Context
	st     store.Store
	clk    *clock.Fake
	fake   *fake.Provider
	svc    *instances.Service
	sensor *liveness.Sensor
	nodeID store.NodeID
}

var t0 = instancestest.T0

func setup(t *testing.T) *fixture {
	t.Helper()
	e := instancestest.New(t, instancestest.SQLite(t), instancestest.Options{Node: "n", Timeout: 30 * time.Second})
	s := &liveness.Sensor{Store: e.Store, Clock: e.Clock, Log: e.Log, Instances: e.Instances, Grace: -1}
	return &fixture{ctx: e.Ctx, st: e.Store, clk: e.Clock, fake: e.Fake, svc: e.Instances, sensor: s, nodeID: e.Node.ID}
}

// running adds a running instance with a machine that last heartbeat now.
func (f *fixture) running(t *testing.T) *store.Instance {
	t.Helper()
	now := f.clk.Now()
	in := &store.Instance{NodeID: f.nodeID, Status: lifecycle.Running, Provider: fake.Name, CreatedAt: now, UpdatedAt: now, AgentReport: store.AgentReport{LastHeartbeatAt: &now}}
	if err := f.st.CreateInstance(f.ctx, in); err != nil {
		t.Fatal(err)
	}
	m, err := f.fake.Provision(f.ctx, providers.Spec{InstanceID: in.ID.String()})
	if err != nil {
		t.Fatal(err)
	}
	in.CloudInstanceID = m.ID
	if err := f.st.UpdateInstance(f.ctx, in); err != nil {
		t.Fatal(err)
	}
	return in
}

func (f *fixture) heartbeat(t *testing.T, id store.InstanceID) {
	t.Helper()
	if err := f.st.RecordHeartbeats(f.ctx, []store.Heartbeat{{InstanceID: id, At: f.clk.Now(), Phase: "ready"}}); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) tick(t *testing.T) liveness.Result {
	t.Helper()
	res, err := f.sensor.Tick(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func (f *fixture) count(t *testing.T, id store.InstanceID, kind store.EventKind) int {
	t.Helper()
	evs, err := f.st.ListEvents(f.ctx, store.EventFilter{InstanceID: id, Kind: kind}, store.Page{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	return len(evs)
}

func TestSilentOncePerSilence(t *testing.T) {
	f := setup(t)
	in := f.running(t)
	f.clk.Advance(2 * time.Minute)
	if res := f.tick(t); res.Silent != 0 {
		t.Fatalf("silent after 2 minutes: %+v", res)
	}
	f.clk.Advance(90 * time.Second)
	if res := f.tick(t); res.Silent != 1 {
		t.Fatalf("not silent after 3.5 minutes: %+v", res)
	}
	f.clk.Advance(time.Minute)
	f.tick(t)
	if n := f.count(t, in.ID, events.InstanceSilent); n != 1 {
		t.Fatalf("%d silent events for one silence", n)
	}
	// A heartbeat ends the silence; the next one is reported again.
	f.heartbeat(t, in.ID)
	f.tick(t)
	f.clk.Advance(4 * time.Minute)
	f.tick(t)
	if n := f.count(t, in.ID, events.InstanceSilent); n != 2 {
		t.Fatalf("%d silent events for two silences", n)
	}
}

func TestPresumedDeadAsksTheProvider(t *testing.T) {
	tests := []struct {
		name    string
		arrange func(f *fixture, machine string)
		status  lifecycle.State
		dead    bool
	}{
		{"machine stopped", func(f *fixture, m string) { f.fake.SetState(m, providers.StateStopped) }, lifecycle.Error, true},
		{"machine gone", func(f *fixture, m string) { f.fake.Vanish(m) }, lifecycle.Error, true},
		{"machine running: stays silent", func(*fixture, string) {}, lifecycle.Running, false},
		{"provider cannot answer: no verdict", func(f *fixture, _ string) { f.fake.FailAlways(fake.OpStatus, providers.KindTransient) }, lifecycle.Running, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := setup(t)
			in := f.running(t)
			tc.arrange(f, in.CloudInstanceID)
			f.clk.Advance(11 * time.Minute)
			f.tick(t)
			got, _ := f.st.GetInstance(f.ctx, in.ID)
			if got.Status != tc.status {
				t.Fatalf("instance %s (%q), want %s", got.Status, got.ErrorMessage, tc.status)
			}
			if n := f.count(t, in.ID, events.InstancePresumedDead); (n == 1) != tc.dead {
				t.Fatalf("%d presumed_dead events", n)
			}
			if tc.dead && got.ErrorMessage == "" {
				t.Fatal("presumed dead without a reason")
			}
			if !tc.dead && (got.SilentSince == nil || f.count(t, in.ID, events.InstanceSilent) != 1) {
				t.Fatal("a silent instance kept alive was not reported silent")
			}
		})
	}
}

// The thresholds stretch with the number of running instances.
func TestThresholdsScaleWithFleetSize(t *testing.T) {
	f := setup(t)
	// At 0.01 heartbeats/s, 3 running agents heartbeat every 300 s, so a
	// 200 s silence is normal.
	f.sensor.MaxHeartbeatsPerSecond = 0.01
	ins := []*store.Instance{f.running(t), f.running(t), f.running(t)}
	f.clk.Advance(200 * time.Second)
	if res := f.tick(t); res.Silent != 0 {
		t.Fatalf("silent inside the stretched interval: %+v", res)
	}
	f.clk.Advance(150 * time.Second)
	if res := f.tick(t); res.Silent != len(ins) {
		t.Fatalf("not silent past it: %+v", res)
	}
}

func TestInstancesBeingTerminatedAreLeftAlone(t *testing.T) {
	f := setup(t)
	in := f.running(t)
	now := f.clk.Now()
	in.TerminateRequestedAt = &now
	if err := f.st.UpdateInstance(f.ctx, in); err != nil {
		t.Fatal(err)
	}
	f.fake.Vanish(in.CloudInstanceID)
	f.clk.Advance(time.Hour)
	if res := f.tick(t); res != (liveness.Result{}) {
		t.Fatalf("touched an instance being terminated: %+v", res)
	}
}

// TestBootTimeout: a boot that makes no progress for the timeout goes to
// error with the agent's last word; live boots, warming pool members (the
// reaper's) and boots being terminated are left alone.
func TestBootTimeout(t *testing.T) {
	tests := []struct {
		name      string
		status    lifecycle.State
		poolState lifecycle.PoolState
		age       time.Duration
		terminate bool
		want      bool
	}{
		{"stuck provisioning", lifecycle.Provisioning, lifecycle.NoPool, 16 * time.Minute, false, true},
		{"stuck rebooting", lifecycle.Rebooting, lifecycle.NoPool, 20 * time.Minute, false, true},
		{"stuck starting", lifecycle.Starting, lifecycle.NoPool, 16 * time.Minute, false, true},
		{"booting for a while", lifecycle.Provisioning, lifecycle.NoPool, 10 * time.Minute, false, false},
		{"warming pool member", lifecycle.Provisioning, lifecycle.PoolWarming, time.Hour, false, false},
		{"being terminated", lifecycle.Provisioning, lifecycle.NoPool, time.Hour, true, false},
		{"running is liveness's other half", lifecycle.Running, lifecycle.NoPool, time.Hour, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := setup(t)
			then := f.clk.Now()
			in := &store.Instance{NodeID: f.nodeID, Status: tc.status, Provider: fake.Name, CreatedAt: then, UpdatedAt: then, PoolMember: store.PoolMember{PoolState: tc.poolState}, AgentReport: store.AgentReport{AgentPhase: "pulling", AgentError: "module base:1 digest mismatch", LastHeartbeatAt: &then}}
			if tc.terminate {
				in.TerminateRequestedAt = &then
			}
			if err := f.st.CreateInstance(f.ctx, in); err != nil {
				t.Fatal(err)
			}
			f.clk.Advance(tc.age)
			// A stuck agent may well keep heartbeating, reporting why.
			if err := f.st.RecordHeartbeats(f.ctx, []store.Heartbeat{{InstanceID: in.ID, At: f.clk.Now(), Phase: "pulling",
				AgentError: "module base:1 digest mismatch"}}); err != nil {
				t.Fatal(err)
			}
			res := f.tick(t)
			got, err := f.st.GetInstance(f.ctx, in.ID)
			if err != nil {
				t.Fatal(err)
			}
			if errored := got.Status == lifecycle.Error; errored != tc.want || (res.BootTimedOut == 1) != tc.want {
				t.Fatalf("status %s, timed out %d; want errored=%v", got.Status, res.BootTimedOut, tc.want)
			}
			if tc.want {
				if !strings.Contains(got.ErrorMessage, "pulling") || !strings.Contains(got.ErrorMessage, "digest mismatch") {
					t.Fatalf("the reason must carry the agent's last phase and error: %q", got.ErrorMessage)
				}
				if f.count(t, in.ID, "instance.boot_timeout") != 1 {
					t.Fatal("no instance.boot_timeout event")
				}
			}
		})
	}
}

// TestSwitchTimeout: an agent that reported switching and was not heard
// from again errors its instance after the switch timeout, well before
// the boot timeout; one that came back (any later phase), or is still
// within the timeout, is left alone.
func TestSwitchTimeout(t *testing.T) {
	tests := []struct {
		name      string
		status    lifecycle.State
		phase     string
		poolState lifecycle.PoolState
		quiet     time.Duration
		want      bool
	}{
		{"no agent came back", lifecycle.Provisioning, "switching", lifecycle.NoPool, 4 * time.Minute, true},
		{"after a reboot", lifecycle.Rebooting, "switching", lifecycle.NoPool, 4 * time.Minute, true},
		{"still within the timeout", lifecycle.Provisioning, "switching", lifecycle.NoPool, 2 * time.Minute, false},
		{"quiet while pulling is the boot timeout's", lifecycle.Provisioning, "pulling", lifecycle.NoPool, 4 * time.Minute, false},
		{"warming pool member too (the reaper then replaces it)", lifecycle.Provisioning, "switching", lifecycle.PoolWarming, 4 * time.Minute, true},
		{"running is liveness's other half", lifecycle.Running, "switching", lifecycle.NoPool, 4 * time.Minute, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := setup(t)
			then := f.clk.Now()
			in := &store.Instance{NodeID: f.nodeID, Status: tc.status, Provider: fake.Name, CreatedAt: then, UpdatedAt: then, PoolMember: store.PoolMember{PoolState: tc.poolState}, AgentReport: store.AgentReport{AgentPhase: tc.phase, LastHeartbeatAt: &then}}
			if err := f.st.CreateInstance(f.ctx, in); err != nil {
				t.Fatal(err)
			}
			f.clk.Advance(tc.quiet)
			res := f.tick(t)
			got, err := f.st.GetInstance(f.ctx, in.ID)
			if err != nil {
				t.Fatal(err)
			}
			if errored := got.Status == lifecycle.Error; errored != tc.want || (res.SwitchTimedOut == 1) != tc.want {
				t.Fatalf("status %s, switch timed out %d; want errored=%v", got.Status, res.SwitchTimedOut, tc.want)
			}
			if tc.want {
				if !strings.Contains(got.ErrorMessage, "did not come back after switching") || !strings.Contains(got.ErrorMessage, "tether-agent") {
					t.Fatalf("the reason must say the agent did not come back and what starts it: %q", got.ErrorMessage)
				}
				if f.count(t, in.ID, "instance.boot_timeout") != 1 {
					t.Fatal("no instance.boot_timeout event")
				}
			}
		})
	}
}
