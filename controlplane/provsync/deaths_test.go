package provsync_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/provsync"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/worker"
	"github.com/tetherfleet/tether/internal/testkit/instancestest"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/fake"
)

// member makes in a ready member of a pool of its own.
func (f *fixture) member(t *testing.T, in *store.Instance) {
	t.Helper()
	p := &store.Pool{Name: "p-" + in.ID.String()[len(in.ID)-8:], TemplateID: f.tplID, Provider: fake.Name, LifecycleClass: store.ClassEphemeral,
		TargetSize: 1, MaxSize: 2, Status: store.PoolActive, CreatedAt: t0, UpdatedAt: t0}
	if err := f.st.CreatePool(f.ctx, p); err != nil {
		t.Fatal(err)
	}
	in.PoolID, in.PoolState = p.ID, lifecycle.PoolReady
	if err := f.st.UpdateInstance(f.ctx, in); err != nil {
		t.Fatal(err)
	}
}

// A running row whose machine the provider reports stopped (a QEMU killed
// outside Tether) goes to error with what was observed, and a ready member
// leaves ready; a stopped machine's row in stopping is a stop in progress
// and is left to it.
func TestStoppedMachineOfARunningRowGoesToError(t *testing.T) {
	f := setup(t)
	dead := f.instance(t, fake.Name, lifecycle.Running)
	f.member(t, dead)
	alive := f.instance(t, fake.Name, lifecycle.Running)
	stopping := f.instance(t, fake.Name, lifecycle.Stopping)
	f.fake.SetState(stopping.CloudInstanceID, providers.StateStopped)
	if !f.fake.Crash(dead.CloudInstanceID, "qemu killed by signal 9 (killed, exit status 137)") {
		t.Fatal("no machine to crash")
	}
	res, err := f.syncer.Tick(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Errored != 1 {
		t.Fatalf("errored %d rows, want the one whose machine stopped", res.Errored)
	}
	got := f.get(t, dead.ID)
	want := "machine exited outside Tether (qemu killed by signal 9 (killed, exit status 137))"
	if got.Status != lifecycle.Error || got.ErrorMessage != want {
		t.Fatalf("dead row: %s %q, want error %q", got.Status, got.ErrorMessage, want)
	}
	if got.PoolState != lifecycle.PoolErrored || got.PoolNextTerminateAt == nil {
		t.Fatalf("dead member is %s (next terminate %v); it must leave ready for the errored ladder", got.PoolState, got.PoolNextTerminateAt)
	}
	evs := f.events(t, dead.ID, events.InstanceErrored)
	if len(evs) != 1 || !strings.Contains(evs[0].Message, "exit status 137") {
		t.Fatalf("instance.errored events: %d", len(evs))
	}
	if got := f.get(t, alive.ID); got.Status != lifecycle.Running {
		t.Fatalf("a running machine's row moved to %s", got.Status)
	}
	if got := f.get(t, stopping.ID); got.Status != lifecycle.Stopping {
		t.Fatalf("a stop in progress was moved to %s", got.Status)
	}
}

// checks runs a Checks queue until the test ends and returns it with a
// channel of the instances it finished.
func (f *fixture) checks(t *testing.T) (*provsync.Checks, <-chan store.InstanceID) {
	t.Helper()
	done := make(chan store.InstanceID, 16)
	c := &provsync.Checks{Syncer: f.syncer, Workers: 2, Done: func(id store.InstanceID, _ bool, err error) {
		if err != nil {
			t.Errorf("check %s: %v", id, err)
		}
		done <- id
	}}
	ctx, cancel := context.WithCancel(f.ctx)
	stopped := make(chan struct{})
	go func() { defer close(stopped); c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-stopped })
	return c, done
}

func waitCheck(t *testing.T, done <-chan store.InstanceID, id store.InstanceID) {
	t.Helper()
	for {
		select {
		case got := <-done:
			if got == id {
				return
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("no check of %s ran", id)
		}
	}
}

// The provider's exit signal (a reaped QEMU child) moves the row at once,
// without a provider sync tick.
func TestProviderExitMovesTheRowAtOnce(t *testing.T) {
	f := setup(t)
	in := f.instance(t, fake.Name, lifecycle.Running)
	f.member(t, in)
	c, done := f.checks(t)
	f.fake.WatchExits(f.ctx, c.Exit)
	f.fake.Crash(in.CloudInstanceID, "qemu exit status 1")
	waitCheck(t, done, in.ID)
	got := f.get(t, in.ID)
	if got.Status != lifecycle.Error || got.PoolState != lifecycle.PoolErrored || !strings.Contains(got.ErrorMessage, "qemu exit status 1") {
		t.Fatalf("after the exit signal: %s/%s %q", got.Status, got.PoolState, got.ErrorMessage)
	}
	if len(f.fake.CallsFor(fake.OpList)) != 0 {
		t.Fatal("the exit signal ran a provider sync (List) instead of one Status")
	}
}

// A dropped stream asks the provider: a machine that is gone or stopped
// moves its row; one the provider reports running (a partitioned agent)
// stays running.
func TestStreamLostAsksTheProvider(t *testing.T) {
	f := setup(t)
	gone := f.instance(t, fake.Name, lifecycle.Running)
	partitioned := f.instance(t, fake.Name, lifecycle.Running)
	c, done := f.checks(t)
	f.fake.Vanish(gone.CloudInstanceID)
	c.Signal(gone.ID, "stream_lost")
	waitCheck(t, done, gone.ID)
	c.Signal(partitioned.ID, "stream_lost")
	waitCheck(t, done, partitioned.ID)
	if got := f.get(t, gone.ID); got.Status != lifecycle.Error {
		t.Fatalf("a lost stream whose machine is gone left the row %s", got.Status)
	}
	if got := f.get(t, partitioned.ID); got.Status != lifecycle.Running {
		t.Fatalf("a partitioned agent's running machine was moved to %s", got.Status)
	}
}

// A provider that cannot answer is no evidence: the row stays.
func TestCheckWithoutAnAnswerConcludesNothing(t *testing.T) {
	f := setup(t)
	in := f.instance(t, fake.Name, lifecycle.Running)
	f.fake.Crash(in.CloudInstanceID, "qemu exit status 1")
	f.fake.FailNext(fake.OpStatus, 1, providers.KindTransient)
	moved, err := f.syncer.Check(f.ctx, in.ID, "stream_lost")
	if err != nil || moved {
		t.Fatalf("Check = %v, %v; a failed Status must conclude nothing", moved, err)
	}
	if got := f.get(t, in.ID); got.Status != lifecycle.Running {
		t.Fatalf("row moved to %s on no answer", got.Status)
	}
	if moved, err = f.syncer.Check(f.ctx, in.ID, "stream_lost"); err != nil || !moved {
		t.Fatalf("second Check = %v, %v; the answer now says stopped", moved, err)
	}
}

// A stopped machine seen on a dropped stream's check is asked about again
// StreamLostConfirm later: a machine that runs by then (a BMC reporting a
// passing state, an agent restarting) keeps its row; one still stopped
// moves.
func TestStreamLostStopConfirmedOnceMore(t *testing.T) {
	for _, tc := range []struct {
		name      string
		thenState providers.MachineState
		moves     bool
	}{
		{"running again", providers.StateRunning, false},
		{"still stopped", providers.StateStopped, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := instancestest.New(t, instancestest.SQLite(t), instancestest.Options{Node: "n", Timeout: 30 * time.Second})
			f := &fixture{ctx: e.Ctx, st: e.Store, fake: e.Fake, nodeID: e.Node.ID, tplID: e.Template.ID,
				syncer: &provsync.Syncer{Store: e.Store, Clock: e.Clock, Log: e.Log, Instances: e.Instances, StreamLostConfirm: 2 * time.Second}}
			in := f.instance(t, fake.Name, lifecycle.Running)
			f.fake.SetState(in.CloudInstanceID, providers.StateStopped)
			type result struct {
				moved bool
				err   error
			}
			done := make(chan result, 1)
			go func() {
				moved, err := f.syncer.Check(f.ctx, in.ID, provsync.SourceStreamLost)
				done <- result{moved, err}
			}()
			if err := e.Clock.BlockUntilPending(f.ctx, func(p []time.Duration) bool { return len(p) == 1 && p[0] == 2*time.Second }); err != nil {
				t.Fatalf("the check did not wait to confirm: %v", err)
			}
			f.fake.SetState(in.CloudInstanceID, tc.thenState)
			e.Clock.Advance(2 * time.Second)
			r := <-done
			if r.err != nil || r.moved != tc.moves {
				t.Fatalf("Check = %v, %v; want moved %v", r.moved, r.err, tc.moves)
			}
			want := lifecycle.Running
			if tc.moves {
				want = lifecycle.Error
			}
			if got := f.get(t, in.ID); got.Status != want {
				t.Fatalf("row is %s, want %s", got.Status, want)
			}
		})
	}
}

// A stop or reboot stops the machine on purpose while its row still reads
// running: the exit it causes is no death, and the operation settles the
// row. With no operation under way the same signal moves the row.
func TestExitDuringAPowerOperationIsLeftToIt(t *testing.T) {
	f := setup(t)
	in := f.instance(t, fake.Name, lifecycle.Running)
	task := worker.NewLeased(in.ID, instances.TaskStop, "replica-a", t0, time.Minute)
	if err := f.st.CreateTask(f.ctx, task); err != nil {
		t.Fatal(err)
	}
	f.fake.SetState(in.CloudInstanceID, providers.StateStopped)
	moved, err := f.syncer.Check(f.ctx, in.ID, "qemu_exit")
	if err != nil || moved {
		t.Fatalf("check during a stop: moved=%v err=%v, want the row left to the stop", moved, err)
	}
	if got := f.get(t, in.ID); got.Status != lifecycle.Running {
		t.Fatalf("the stop's own exit moved the row to %s", got.Status)
	}
	if err := f.st.Tx(f.ctx, func(q store.Queries) error {
		_, err := worker.Finish(f.ctx, q, task, nil, t0)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if moved, err := f.syncer.Check(f.ctx, in.ID, "qemu_exit"); err != nil || !moved {
		t.Fatalf("check after the operation ended: moved=%v err=%v, want the row errored", moved, err)
	}
}

// A machine that exits while its instance boots (after a provision, a
// start or a reboot, before the agent reports) died too: the exit signal
// and the periodic pass both move the row, and a warming member leaves
// warming at once instead of at its warming timeout. A row that is
// stopping or stopped is off on purpose and stays.
func TestMachineThatExitsWhileBootingMovesTheRow(t *testing.T) {
	for _, tc := range []struct {
		status lifecycle.State
		moves  bool
	}{
		{lifecycle.Provisioning, true},
		{lifecycle.Starting, true},
		{lifecycle.Rebooting, true},
		{lifecycle.Stopping, false},
		{lifecycle.Stopped, false},
	} {
		t.Run(string(tc.status), func(t *testing.T) {
			for _, via := range []string{"exit signal", "provider sync"} {
				t.Run(via, func(t *testing.T) {
					f := setup(t)
					in := f.instance(t, fake.Name, tc.status)
					f.member(t, in)
					warming := f.get(t, in.ID)
					warming.PoolState = lifecycle.PoolWarming
					if err := f.st.UpdateInstance(f.ctx, warming); err != nil {
						t.Fatal(err)
					}
					if via == "exit signal" {
						c, done := f.checks(t)
						f.fake.WatchExits(f.ctx, c.Exit)
						f.fake.Crash(in.CloudInstanceID, "qemu exit status 0")
						waitCheck(t, done, in.ID)
					} else {
						f.fake.SetState(in.CloudInstanceID, providers.StateStopped)
						if _, err := f.syncer.Tick(f.ctx); err != nil {
							t.Fatal(err)
						}
					}
					got := f.get(t, in.ID)
					if !tc.moves {
						if got.Status != tc.status {
							t.Fatalf("a %s row moved to %s", tc.status, got.Status)
						}
						return
					}
					if got.Status != lifecycle.Error || got.PoolState != lifecycle.PoolErrored ||
						!strings.Contains(got.ErrorMessage, "while the instance was "+string(tc.status)) {
						t.Fatalf("after the machine exited: %s/%s %q", got.Status, got.PoolState, got.ErrorMessage)
					}
				})
			}
		})
	}
}
