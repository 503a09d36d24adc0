package instances_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/pki"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/fake"
)

type powerFunc func(*instances.Service, *env, store.InstanceID) (*store.Instance, error)

var (
	doStart powerFunc = func(s *instances.Service, e *env, id store.InstanceID) (*store.Instance, error) {
		return s.Start(e.ctx, id)
	}
	doStop powerFunc = func(s *instances.Service, e *env, id store.InstanceID) (*store.Instance, error) {
		return s.Stop(e.ctx, id)
	}
	doReboot powerFunc = func(s *instances.Service, e *env, id store.InstanceID) (*store.Instance, error) {
		return s.Reboot(e.ctx, id)
	}
)

// The provider failing at every step: the caller gets the error, the row
// shows the observed state (never the intended one), and an event is
// written. A provider that acted but lost its answer is judged by what it
// did.
func TestPowerOperationsAnswerTruthfully(t *testing.T) {
	type faultSetup func(e *env, machine string)
	fault := func(op fake.Op, f fake.Fault) faultSetup {
		return func(e *env, _ string) { e.fake.Inject(op, f) }
	}
	statusFails := func(op fake.Op) faultSetup {
		return func(e *env, _ string) {
			e.fake.Inject(op, fake.Fault{Kind: providers.KindTransient, Message: "provider api down"})
			e.fake.Inject(fake.OpStatus, fake.Fault{Kind: providers.KindTransient, Message: "status down too"})
		}
	}
	vanish := func(e *env, machine string) { e.fake.Vanish(machine) }
	tests := []struct {
		name    string
		from    lifecycle.State // stopped instances are stopped first
		do      powerFunc
		setup   faultSetup
		code    codes.Code
		status  lifecycle.State
		event   store.EventKind
		errText string // on the instance
	}{
		{"stop", lifecycle.Running, doStop, nil, codes.OK, lifecycle.Stopped, events.InstanceTransition, ""},
		{"stop fails", lifecycle.Running, doStop, fault(fake.OpStop, fake.Fault{Kind: providers.KindTransient, Message: "busy"}),
			codes.Unavailable, lifecycle.Running, events.InstanceProviderFailed, "stop failed: fake stop: transient: busy; machine observed running"},
		{"stop acted, answer lost", lifecycle.Running, doStop, fault(fake.OpStop, fake.Fault{Kind: providers.KindTransient, AfterEffect: true}),
			codes.OK, lifecycle.Stopped, events.InstanceProviderAnswerLost, ""},
		{"stop and status fail", lifecycle.Running, doStop, statusFails(fake.OpStop),
			codes.Unavailable, lifecycle.Running, events.InstanceProviderFailed, "unknown (status failed"},
		{"stop of a vanished machine", lifecycle.Running, doStop, vanish,
			codes.FailedPrecondition, lifecycle.Error, events.InstanceProviderFailed, "is gone"},
		{"start", lifecycle.Stopped, doStart, nil, codes.OK, lifecycle.Starting, events.InstanceTransition, ""},
		{"start fails", lifecycle.Stopped, doStart, fault(fake.OpStart, fake.Fault{Kind: providers.KindPermanent, Message: "no capacity"}),
			codes.FailedPrecondition, lifecycle.Stopped, events.InstanceProviderFailed, "machine observed stopped"},
		{"start quota", lifecycle.Stopped, doStart, fault(fake.OpStart, fake.Fault{Kind: providers.KindQuota}),
			codes.ResourceExhausted, lifecycle.Stopped, events.InstanceProviderFailed, "start failed"},
		{"start acted, answer lost", lifecycle.Stopped, doStart, fault(fake.OpStart, fake.Fault{Kind: providers.KindTransient, AfterEffect: true}),
			codes.OK, lifecycle.Starting, events.InstanceProviderAnswerLost, ""},
		{"start of a vanished machine", lifecycle.Stopped, doStart, vanish,
			codes.FailedPrecondition, lifecycle.Error, events.InstanceProviderFailed, "is gone"},
		{"reboot", lifecycle.Running, doReboot, nil, codes.OK, lifecycle.Rebooting, events.InstanceTransition, ""},
		{"reboot fails", lifecycle.Running, doReboot, fault(fake.OpReboot, fake.Fault{Kind: providers.KindTransient}),
			codes.Unavailable, lifecycle.Running, events.InstanceProviderFailed, "reboot failed"},
		// A reboot that acted looks like a machine that merely kept
		// running, so the failure is reported rather than guessed away.
		{"reboot acted, answer lost", lifecycle.Running, doReboot, fault(fake.OpReboot, fake.Fault{Kind: providers.KindTransient, AfterEffect: true}),
			codes.Unavailable, lifecycle.Running, events.InstanceProviderFailed, "machine observed running"},
		{"reboot of a vanished machine", lifecycle.Running, doReboot, vanish,
			codes.FailedPrecondition, lifecycle.Error, events.InstanceProviderFailed, "is gone"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			in := e.running()
			if tc.from == lifecycle.Stopped {
				if _, err := e.svc.Stop(e.ctx, in.ID); err != nil {
					t.Fatal(err)
				}
			}
			if tc.setup != nil {
				tc.setup(e, in.CloudInstanceID)
			}
			got, err := tc.do(e.svc, e, in.ID)
			wantCode(t, err, tc.code)
			if err == nil && got.Status != tc.status {
				t.Fatalf("answered %s, want %s", got.Status, tc.status)
			}
			in = e.get(in.ID)
			if in.Status != tc.status {
				t.Fatalf("instance %s (%q), want %s", in.Status, in.ErrorMessage, tc.status)
			}
			if !strings.Contains(in.ErrorMessage, tc.errText) || (tc.errText == "" && in.ErrorMessage != "") {
				t.Fatalf("error_message %q, want it to say %q", in.ErrorMessage, tc.errText)
			}
			if !e.hasEvent(in.ID, tc.event) {
				t.Fatalf("no %s event: %v", tc.event, e.eventKinds(in.ID))
			}
			// The operation's task ended with the outcome; none is left open.
			if n := e.openTasks(in.ID); n != 0 {
				t.Fatalf("%d tasks left open", n)
			}
			ts := e.tasks(in.ID)
			last := ts[len(ts)-1]
			if wantTask := map[bool]store.TaskStatus{true: store.TaskSucceeded, false: store.TaskFailed}[tc.code == codes.OK]; last.Status != wantTask {
				t.Fatalf("%s task %s (%s), want %s", last.Kind, last.Status, last.ErrorMessage, wantTask)
			}
			e.noTokenInLogs()
		})
	}
}

// Every boot gets a fresh one-time token that the provider hands over.
func TestStartAndRebootHandOverAFreshToken(t *testing.T) {
	e := newEnv(t)
	in := e.running()
	first, _ := e.fake.Enrollment(in.CloudInstanceID)
	seen := map[string]bool{first.Token: true}
	for _, step := range []struct {
		do   powerFunc
		boot bool
	}{{doReboot, true}, {doStop, false}, {doStart, true}} {
		if _, err := step.do(e.svc, e, in.ID); err != nil {
			t.Fatal(err)
		}
		if err := e.svc.AgentReady(e.ctx, in.ID); err != nil {
			t.Fatal(err)
		}
		enr, _ := e.fake.Enrollment(in.CloudInstanceID)
		if !step.boot {
			continue
		}
		if seen[enr.Token] {
			t.Fatal("a new boot was handed a token an earlier boot had")
		}
		seen[enr.Token] = true
		tok, err := e.st.GetToken(e.ctx, pki.HashToken(enr.Token))
		if err != nil || tok.UsedAt != nil || tok.InstanceID != in.ID || enr.ControlPlaneURL == "" || enr.CAFingerprint == "" {
			t.Fatalf("boot enrollment %+v: token %+v %v", enr, tok, err)
		}
	}
	if b := e.fake.Boots(in.CloudInstanceID); b != 3 {
		t.Fatalf("machine booted %d times, want 3 (provision, reboot, start)", b)
	}
	e.noTokenInLogs()
}

func TestPowerNoopsAndRefusals(t *testing.T) {
	e := newEnv(t)
	in := e.running()
	// Asking for the state it is in: success, no provider call.
	e.fake.ResetCalls()
	if got, err := e.svc.Start(e.ctx, in.ID); err != nil || got.Status != lifecycle.Running {
		t.Fatalf("start a running instance: %v %v", got, err)
	}
	if _, err := e.svc.Stop(e.ctx, in.ID); err != nil {
		t.Fatal(err)
	}
	e.fake.ResetCalls()
	if got, err := e.svc.Stop(e.ctx, in.ID); err != nil || got.Status != lifecycle.Stopped {
		t.Fatalf("stop a stopped instance: %v %v", got, err)
	}
	if calls := e.fake.Calls(); len(calls) != 0 {
		t.Fatalf("no-ops called the provider: %+v", calls)
	}
	// A refused transition names the current and allowed states.
	_, err := e.svc.Reboot(e.ctx, in.ID)
	wantCode(t, err, codes.FailedPrecondition)
	if !isTransitionErr(err) || !strings.Contains(err.Error(), `"stopped"`) || !strings.Contains(err.Error(), "running") {
		t.Fatalf("reboot a stopped instance: %v", err)
	}
	// Another operation in flight holds the instance.
	busy := &store.Task{Target: store.TaskTargetWorker, InstanceID: in.ID, Kind: instances.TaskStart, Payload: []byte("{}"),
		Status: store.TaskPending, MaxAttempts: 3, CreatedAt: t0, UpdatedAt: t0}
	if err := e.st.CreateTask(e.ctx, busy); err != nil {
		t.Fatal(err)
	}
	_, err = e.svc.Start(e.ctx, in.ID)
	wantCode(t, err, codes.FailedPrecondition)
	if !strings.Contains(err.Error(), "in progress") {
		t.Fatalf("concurrent operation: %v", err)
	}
	_, err = e.svc.Stop(e.ctx, "")
	wantCode(t, err, codes.InvalidArgument)
	_, err = e.svc.Stop(e.ctx, "no-such-instance")
	wantCode(t, err, codes.NotFound)
}

func TestOpsHold(t *testing.T) {
	e := newEnv(t)
	in := e.running()
	_, err := e.svc.Hold(e.ctx, in.ID, " ", "alice")
	wantCode(t, err, codes.InvalidArgument)
	if _, err := e.svc.Hold(e.ctx, in.ID, "kernel patch window", "alice"); err != nil {
		t.Fatal(err)
	}
	if got, err := e.svc.Hold(e.ctx, in.ID, "again", "bob"); err != nil || got.HoldReason != "kernel patch window" {
		t.Fatalf("holding a held instance: %v %v", got, err)
	}
	for name, do := range map[string]func() error{
		"reboot":    func() error { _, err := e.svc.Reboot(e.ctx, in.ID); return err },
		"terminate": func() error { _, err := e.svc.Terminate(e.ctx, in.ID); return err },
	} {
		err := do()
		wantCode(t, err, codes.FailedPrecondition)
		if !strings.Contains(err.Error(), "hold") {
			t.Fatalf("%s under a hold: %v", name, err)
		}
	}
	// Stop is allowed under a hold; start then is not.
	if got, err := e.svc.Stop(e.ctx, in.ID); err != nil || got.Status != lifecycle.Stopped {
		t.Fatalf("stop under a hold: %v %v", got, err)
	}
	_, err = e.svc.Start(e.ctx, in.ID)
	wantCode(t, err, codes.FailedPrecondition)
	if e.get(in.ID).TerminateRequestedAt != nil {
		t.Fatal("a refused terminate recorded its intent")
	}
	if _, err := e.svc.Unhold(e.ctx, in.ID, "alice"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Unhold(e.ctx, in.ID, "alice"); err != nil {
		t.Fatalf("unhold of an unheld instance: %v", err)
	}
	if _, err := e.svc.Start(e.ctx, in.ID); err != nil {
		t.Fatal(err)
	}
	for _, k := range []store.EventKind{events.InstanceHeld, events.InstanceUnheld} {
		if !e.hasEvent(in.ID, k) {
			t.Fatalf("no %s event", k)
		}
	}
}

// Every operation on a terminated instance: a clear FailedPrecondition, or
// a no-op success for terminate.
func TestTerminatedInstanceRefusesEverything(t *testing.T) {
	e := newEnv(t)
	in := e.running()
	if _, err := e.svc.Terminate(e.ctx, in.ID); err != nil {
		t.Fatal(err)
	}
	e.fake.ResetCalls()
	if got, err := e.svc.Terminate(e.ctx, in.ID); err != nil || got.Status != lifecycle.Terminated {
		t.Fatalf("terminate again: %v %v", got, err)
	}
	ops := map[string]func() error{
		"start":    func() error { _, err := e.svc.Start(e.ctx, in.ID); return err },
		"stop":     func() error { _, err := e.svc.Stop(e.ctx, in.ID); return err },
		"reboot":   func() error { _, err := e.svc.Reboot(e.ctx, in.ID); return err },
		"hold":     func() error { _, err := e.svc.Hold(e.ctx, in.ID, "x", "a"); return err },
		"unhold":   func() error { _, err := e.svc.Unhold(e.ctx, in.ID, "a"); return err },
		"cordon":   func() error { _, _, err := e.svc.Cordon(e.ctx, in.ID, "x", "a"); return err },
		"uncordon": func() error { _, _, err := e.svc.Uncordon(e.ctx, in.ID, "a"); return err },
		"drain":    func() error { _, _, err := e.svc.Drain(e.ctx, in.ID, "x", "a"); return err },
		"token":    func() error { _, _, err := e.svc.IssueToken(e.ctx, in.ID, 0); return err },
		"seed":     func() error { _, err := e.svc.SeedMaterial(e.ctx, in.ID); return err },
	}
	for name, do := range ops {
		err := do()
		wantCode(t, err, codes.FailedPrecondition)
		if !strings.Contains(err.Error(), "terminated") {
			t.Errorf("%s: %v does not say why", name, err)
		}
	}
	if calls := e.fake.Calls(); len(calls) != 0 {
		t.Fatalf("operations on a terminated instance called the provider: %+v", calls)
	}
}

// Terminate and stop racing on one instance end consistently: terminated,
// no machine, nothing left open, and the stop either finished first or was
// told plainly that the instance was (being) terminated.
func TestTerminateAndStopRace(t *testing.T) {
	check := func(t *testing.T, e *env, id store.InstanceID, stopErr, termErr error) {
		t.Helper()
		if termErr != nil {
			t.Fatalf("terminate: %v", termErr)
		}
		if stopErr != nil {
			wantCode(t, stopErr, codes.FailedPrecondition)
			if !strings.Contains(stopErr.Error(), "terminat") {
				t.Fatalf("stop lost the race with an unclear answer: %v", stopErr)
			}
		}
		got := e.get(id)
		if got.Status != lifecycle.Terminated || len(e.fake.Machines()) != 0 || e.openTasks(id) != 0 {
			t.Fatalf("instance %s, %d machines, %d open tasks (stop: %v)", got.Status, len(e.fake.Machines()), e.openTasks(id), stopErr)
		}
	}
	// Interleavings forced with the fake's gates.
	t.Run("stop in flight when terminate runs", func(t *testing.T) {
		e := newEnv(t)
		in := e.running()
		release := e.fake.Block(fake.OpStop)
		stopDone := make(chan error, 1)
		go func() { _, err := e.svc.Stop(e.ctx, in.ID); stopDone <- err }()
		inFlight(t, e.fake, fake.OpStop)
		if n := e.openTasks(in.ID); n != 1 {
			t.Fatalf("%d open tasks with the stop in flight", n)
		}
		_, termErr := e.svc.Terminate(e.ctx, in.ID)
		release()
		stopErr := <-stopDone
		if stopErr == nil {
			t.Fatal("a stop overtaken by terminate reported success")
		}
		check(t, e, in.ID, stopErr, termErr)
	})
	t.Run("terminate in flight when stop arrives", func(t *testing.T) {
		e := newEnv(t)
		in := e.running()
		release := e.fake.Block(fake.OpTerminate)
		termDone := make(chan error, 1)
		go func() { _, err := e.svc.Terminate(e.ctx, in.ID); termDone <- err }()
		inFlight(t, e.fake, fake.OpTerminate)
		if e.get(in.ID).TerminateRequestedAt == nil {
			t.Fatal("terminate in flight without its recorded intent")
		}
		_, stopErr := e.svc.Stop(e.ctx, in.ID)
		release()
		check(t, e, in.ID, stopErr, <-termDone)
		if len(e.fake.CallsFor(fake.OpStop)) != 0 {
			t.Fatal("a stop reached the provider while the instance was being terminated")
		}
	})
	t.Run("stop first, then terminate", func(t *testing.T) {
		e := newEnv(t)
		in := e.running()
		_, stopErr := e.svc.Stop(e.ctx, in.ID)
		_, termErr := e.svc.Terminate(e.ctx, in.ID)
		check(t, e, in.ID, stopErr, termErr)
	})
	// And free-running, with varied provider latencies.
	for i := range 10 {
		e := newEnv(t)
		in := e.running()
		e.fake.SetDelay(fake.OpStop, time.Duration(i%4)*time.Millisecond)
		e.fake.SetDelay(fake.OpTerminate, time.Duration((i/4)%3)*time.Millisecond)
		var wg sync.WaitGroup
		var stopErr, termErr error
		wg.Add(2)
		go func() { defer wg.Done(); _, stopErr = e.svc.Stop(e.ctx, in.ID) }()
		go func() { defer wg.Done(); _, termErr = e.svc.Terminate(e.ctx, in.ID) }()
		wg.Wait()
		check(t, e, in.ID, stopErr, termErr)
	}
}

type activeCA string

func (a activeCA) Fingerprint() string { return string(a) }

// A boot after a CA rotation's activate is handed the new CA's
// fingerprint (fw_cfg, the provider's boot): it is read at each boot.
func TestBootAfterActivatePinsTheNewCA(t *testing.T) {
	e := newEnv(t)
	in := e.running()
	first, _ := e.fake.Enrollment(in.CloudInstanceID)
	rotated := "sha256:" + strings.Repeat("07", 32)
	if first.CAFingerprint == rotated {
		t.Fatal("the fixture already pins the rotated CA")
	}
	e.svc.CA = activeCA(rotated)
	if _, err := doReboot(e.svc, e, in.ID); err != nil {
		t.Fatal(err)
	}
	if enr, _ := e.fake.Enrollment(in.CloudInstanceID); enr.CAFingerprint != rotated {
		t.Fatalf("the boot after activate pins %s, want %s", enr.CAFingerprint, rotated)
	}
}
