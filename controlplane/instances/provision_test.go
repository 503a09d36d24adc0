package instances_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/worker"
	"github.com/tetherfleet/tether/pki"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/fake"
)

func TestProvisionIsAsyncAndIdempotent(t *testing.T) {
	e := newEnv(t)
	p := instances.ProvisionParams{Node: e.node.Name, Provider: fake.Name, OperationID: "op-1", Region: "r1", InstanceType: "small"}
	first, err := e.svc.Provision(e.ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if first.Instance.Status != lifecycle.Pending || first.TaskID == "" || first.Token != "" {
		t.Fatalf("provision answered %s, task %q, token shown %v", first.Instance.Status, first.TaskID, first.Token != "")
	}
	if n := len(e.fake.Machines()); n != 0 {
		t.Fatalf("provision must return before any machine exists; %d exist", n)
	}
	again, err := e.svc.Provision(e.ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Existed || again.Instance.ID != first.Instance.ID || again.TaskID != first.TaskID {
		t.Fatalf("retry: existed %v, instance %s vs %s, task %s vs %s", again.Existed, again.Instance.ID, first.Instance.ID, again.TaskID, first.TaskID)
	}
	if n := len(e.tasks(first.Instance.ID)); n != 1 {
		t.Fatalf("a retried provision made %d tasks", n)
	}

	if ran, err := e.wk.RunOnce(e.ctx); !ran || err != nil {
		t.Fatalf("worker: %v %v", ran, err)
	}
	if ran, _ := e.wk.RunOnce(e.ctx); ran {
		t.Fatal("a second worker pass found another task")
	}
	in := e.get(first.Instance.ID)
	if in.Status != lifecycle.Provisioning || in.CloudInstanceID != fake.MachineID(in.ID.String()) {
		t.Fatalf("after the worker: %s, machine %q", in.Status, in.CloudInstanceID)
	}
	task, err := e.st.GetTask(e.ctx, first.TaskID)
	if err != nil || task.Status != store.TaskSucceeded || task.Target != store.TaskTargetWorker || task.Kind != instances.TaskProvision {
		t.Fatalf("task %+v %v", task, err)
	}
	calls := e.fake.CallsFor(fake.OpProvision)
	if len(calls) != 1 {
		t.Fatalf("%d provision calls", len(calls))
	}
	// The machine got the artifacts, the template's arguments and a live
	// one-time token, with the enrollment data beside it.
	spec := calls[0].Spec
	if spec.Region != "r1" || spec.InstanceType != "small" || spec.Boot.KernelArgs != "console=ttyS0 quiet" ||
		!strings.Contains(spec.Boot.KernelPath, "sha256") || !strings.HasSuffix(spec.Boot.KernelURL, e.svc.Artifacts.Kernel) {
		t.Fatalf("spec %+v", spec)
	}
	enr := spec.Boot.Enrollment
	if enr.ControlPlaneURL != e.svc.AgentURL || enr.CAFingerprint != e.svc.CAFingerprint {
		t.Fatalf("enrollment %+v", enr)
	}
	tok, err := e.st.GetToken(e.ctx, pki.HashToken(enr.Token))
	if err != nil || tok.InstanceID != in.ID || tok.UsedAt != nil {
		t.Fatalf("token handed to the machine: %+v %v", tok, err)
	}
	for _, k := range []store.EventKind{events.InstanceProvisioned, events.InstanceTransition, events.TokenIssued, events.InstanceMachineCreated} {
		if !e.hasEvent(in.ID, k) {
			t.Errorf("no %s event: %v", k, e.eventKinds(in.ID))
		}
	}
	e.noTokenInLogs()
}

func TestProvisionRefusals(t *testing.T) {
	e := newEnv(t)
	_, err := e.svc.Provision(e.ctx, instances.ProvisionParams{Node: e.node.Name, Provider: "nope"})
	wantCode(t, err, codes.InvalidArgument)
	_, err = e.svc.Provision(e.ctx, instances.ProvisionParams{Node: "ghost", Provider: fake.Name})
	wantCode(t, err, codes.NotFound)

	noKernel := *e.svc
	noKernel.Artifacts = &instances.Artifacts{Blobs: e.svc.Artifacts.Blobs}
	_, err = noKernel.Provision(e.ctx, instances.ProvisionParams{Node: e.node.Name, Provider: fake.Name})
	wantCode(t, err, codes.FailedPrecondition)

	e.node.Enabled = false
	if err := e.st.UpdateNode(e.ctx, e.node); err != nil {
		t.Fatal(err)
	}
	_, err = e.svc.Provision(e.ctx, instances.ProvisionParams{Node: e.node.Name, Provider: fake.Name})
	wantCode(t, err, codes.FailedPrecondition)
	if !strings.Contains(err.Error(), "disabled") {
		t.Fatalf("disabled node: %v", err)
	}
	if n, _ := e.st.CountInstances(e.ctx, store.InstanceFilter{}); n != 0 {
		t.Fatalf("refused provisions left %d instances", n)
	}
}

func TestProvisionProviderFailures(t *testing.T) {
	tests := []struct {
		name  string
		fault fake.Fault
		// wantStatus is the instance's state after the task ends.
		wantStatus lifecycle.State
		wantCalls  int
		wantEvent  store.EventKind
		wantTask   store.TaskStatus
	}{
		{"permanent", fake.Fault{Kind: providers.KindPermanent, Message: "no such image"}, lifecycle.Error, 1, events.InstanceProviderFailed, store.TaskFailed},
		{"quota is not retried", fake.Fault{Kind: providers.KindQuota, Message: "quota exceeded"}, lifecycle.Error, 1, events.InstanceProviderFailed, store.TaskFailed},
		{"transient once, then fine", fake.Fault{Kind: providers.KindTransient, Times: 1}, lifecycle.Provisioning, 2, events.InstanceMachineCreated, store.TaskSucceeded},
		{"transient every time", fake.Fault{Kind: providers.KindTransient, Message: "api timeout"}, lifecycle.Error, instances.DefaultProvisionAttempts, events.InstanceProviderFailed, store.TaskFailed},
		{"acted, answer lost", fake.Fault{Kind: providers.KindPermanent, Times: 1, AfterEffect: true}, lifecycle.Provisioning, 1, events.InstanceProviderAnswerLost, store.TaskSucceeded},
		{"unsupported", fake.Fault{Kind: providers.KindUnsupported, Message: "disabled"}, lifecycle.Error, 1, events.InstanceProviderFailed, store.TaskFailed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.fake.Inject(fake.OpProvision, tc.fault)
			res, err := e.svc.Provision(e.ctx, instances.ProvisionParams{Node: e.node.Name, Provider: fake.Name})
			if err != nil {
				t.Fatal(err)
			}
			// The retry back-offs wait on the service's clock: they pass
			// at once here, and the clock shows them, doubling from
			// RetryBackoff.
			actx, stop := context.WithCancel(e.ctx)
			go e.clk.AutoAdvance(actx)
			from := e.clk.Now()
			_, err = e.wk.RunOnce(e.ctx)
			stop()
			if err != nil {
				t.Fatal(err)
			}
			var backoffs time.Duration
			for i := range tc.wantCalls - 1 {
				backoffs += e.svc.RetryBackoff << i
			}
			if moved := e.clk.Now().Sub(from); moved != backoffs {
				t.Fatalf("the clock moved %v through the retries, want %v of back-off", moved, backoffs)
			}
			in := e.get(res.Instance.ID)
			if in.Status != tc.wantStatus {
				t.Fatalf("instance %s (%s), want %s", in.Status, in.ErrorMessage, tc.wantStatus)
			}
			if n := len(e.fake.CallsFor(fake.OpProvision)); n != tc.wantCalls {
				t.Fatalf("%d provision calls, want %d", n, tc.wantCalls)
			}
			if !e.hasEvent(in.ID, tc.wantEvent) {
				t.Fatalf("no %s event: %v", tc.wantEvent, e.eventKinds(in.ID))
			}
			task, _ := e.st.GetTask(e.ctx, res.TaskID)
			if task.Status != tc.wantTask {
				t.Fatalf("task %s (%s), want %s", task.Status, task.ErrorMessage, tc.wantTask)
			}
			if tc.wantStatus == lifecycle.Error {
				// The provider's words reach the task, the instance and
				// nothing is left behind.
				msg := tc.fault.Message
				if msg == "" {
					msg = "injected"
				}
				if !strings.Contains(task.ErrorMessage, msg) || !strings.Contains(in.ErrorMessage, msg) {
					t.Fatalf("error text lost: task %q, instance %q", task.ErrorMessage, in.ErrorMessage)
				}
				if n := len(e.fake.Machines()); n != 0 {
					t.Fatalf("%d machines left after a failed provision", n)
				}
			} else if in.CloudInstanceID == "" || len(e.fake.Machines()) != 1 {
				t.Fatalf("machine %q, %d machines", in.CloudInstanceID, len(e.fake.Machines()))
			}
			e.noTokenInLogs()
		})
	}
}

// A worker that dies mid-task loses nothing: the lease lapses, the task is
// retried, and the provider's idempotence leaves one machine.
func TestWorkerDiesMidProvision(t *testing.T) {
	for _, acted := range []bool{false, true} {
		name := map[bool]string{false: "before the provider acted", true: "after the provider acted"}[acted]
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			res, err := e.svc.Provision(e.ctx, instances.ProvisionParams{Node: e.node.Name, Provider: fake.Name})
			if err != nil {
				t.Fatal(err)
			}
			release := e.fake.Block(fake.OpProvision)
			wctx, die := context.WithCancel(e.ctx)
			dead := make(chan struct{})
			go func() {
				defer close(dead)
				_, _ = e.wk.RunOnce(wctx)
			}()
			inFlight(t, e.fake, fake.OpProvision)
			if task, _ := e.st.GetTask(e.ctx, res.TaskID); task.Status != store.TaskRunning {
				t.Fatalf("provision task is %s with its call in flight", task.Status)
			}
			if acted {
				// The call made the machine, and the worker dies before
				// it can record it.
				e.fake.Plant(providers.Machine{ID: fake.MachineID(res.Instance.ID.String()), InstanceID: res.Instance.ID.String()})
			}
			die()
			<-dead
			release()
			task, _ := e.st.GetTask(e.ctx, res.TaskID)
			if task.Status != store.TaskRunning {
				t.Fatalf("a dead worker's task is %s, want still running under its lease", task.Status)
			}
			// Lease expiry hands the task back.
			e.clk.Advance(worker.DefaultLease + time.Second)
			expired, err := e.st.ExpireTaskLeases(e.ctx, e.clk.Now())
			if err != nil || len(expired) != 1 || expired[0].Status != store.TaskPending {
				t.Fatalf("expire: %v %v", expired, err)
			}
			other := *e.wk
			other.Owner = "worker-2"
			if ran, err := other.RunOnce(e.ctx); !ran || err != nil {
				t.Fatalf("retry: %v %v", ran, err)
			}
			task, _ = e.st.GetTask(e.ctx, res.TaskID)
			in := e.get(res.Instance.ID)
			if task.Status != store.TaskSucceeded || task.Attempts != 1 || in.Status != lifecycle.Provisioning || in.CloudInstanceID == "" {
				t.Fatalf("after retry: task %s attempts %d, instance %s machine %q", task.Status, task.Attempts, in.Status, in.CloudInstanceID)
			}
			if n := len(e.fake.Machines()); n != 1 {
				t.Fatalf("%d machines exist, want exactly one", n)
			}
		})
	}
}

func TestSweepErrorsDanglingProvisions(t *testing.T) {
	e := newEnv(t)
	res, err := e.svc.Provision(e.ctx, instances.ProvisionParams{Node: e.node.Name, Provider: fake.Name})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := e.svc.SweepProvisions(e.ctx); n != 0 || err != nil {
		t.Fatalf("a pending task's instance was swept: %d %v", n, err)
	}
	// An operator cancels the provision task: the instance must not sit in
	// pending for ever.
	task, _ := e.st.GetTask(e.ctx, res.TaskID)
	task.Status, task.ErrorMessage = store.TaskCancelled, "cancelled before it started"
	if err := e.st.UpdateTask(e.ctx, task); err != nil {
		t.Fatal(err)
	}
	if n, err := e.svc.SweepProvisions(e.ctx); n != 1 || err != nil {
		t.Fatalf("sweep: %d %v", n, err)
	}
	in := e.get(res.Instance.ID)
	if in.Status != lifecycle.Error || !strings.Contains(in.ErrorMessage, "cancelled") {
		t.Fatalf("instance %s: %q", in.Status, in.ErrorMessage)
	}
	if !e.hasEvent(in.ID, events.InstanceProviderFailed) {
		t.Fatal("no event for the swept instance")
	}
}

func TestTerminatedBeforeTheWorkerRan(t *testing.T) {
	e := newEnv(t)
	res, err := e.svc.Provision(e.ctx, instances.ProvisionParams{Node: e.node.Name, Provider: fake.Name})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Terminate(e.ctx, res.Instance.ID); err != nil {
		t.Fatal(err)
	}
	task, _ := e.st.GetTask(e.ctx, res.TaskID)
	if task.Status != store.TaskCancelled {
		t.Fatalf("provision task of a terminated instance is %s", task.Status)
	}
	if ran, _ := e.wk.RunOnce(e.ctx); ran {
		t.Fatal("the worker ran a cancelled task")
	}
	if n := len(e.fake.CallsFor(fake.OpProvision)); n != 0 {
		t.Fatalf("%d machines created for a terminated instance", n)
	}
}

// inFlight waits until a call of op, blocked with Block beforehand, has
// reached the fake provider: what its caller does before it is done.
func inFlight(t *testing.T, p *fake.Provider, op fake.Op) {
	t.Helper()
	entered := p.Entered(op)
	if entered == nil {
		t.Fatalf("inFlight(%s): the op is not blocked", op)
	}
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s call reached the provider within 10s", op)
	}
}

// A terminate that lands while the machine is being made: the provision
// task is cancelled under the worker, and a machine the call made anyway
// is destroyed rather than left running behind a terminated row.
func TestTerminateDuringProvision(t *testing.T) {
	e := newEnv(t)
	const lease = 300 * time.Millisecond
	e.wk.Lease = lease
	res, err := e.svc.Provision(e.ctx, instances.ProvisionParams{Node: e.node.Name, Provider: fake.Name})
	if err != nil {
		t.Fatal(err)
	}
	release := e.fake.Block(fake.OpProvision)
	defer release()
	done := make(chan struct{})
	go func() { defer close(done); _, _ = e.wk.RunOnce(e.ctx) }()
	inFlight(t, e.fake, fake.OpProvision)
	if st := e.get(res.Instance.ID).Status; st != lifecycle.Provisioning {
		t.Fatalf("instance is %s with its provision in flight", st)
	}
	if _, err := e.svc.Terminate(e.ctx, res.Instance.ID); err != nil {
		t.Fatal(err)
	}
	// The in-flight call made its machine after all.
	e.fake.Plant(providers.Machine{ID: fake.MachineID(res.Instance.ID.String()), InstanceID: res.Instance.ID.String()})
	// The worker learns of the terminate at its next lease renewal, a
	// third of a lease on.
	if err := e.clk.BlockUntilPending(e.ctx, func(p []time.Duration) bool { return slices.Contains(p, lease/3) }); err != nil {
		t.Fatalf("no lease renewal pending: %v", err)
	}
	e.clk.Advance(lease / 3)
	<-done
	if n := len(e.fake.Machines()); n != 0 {
		t.Fatalf("%d machines outlive their terminated instance", n)
	}
	if !e.hasEvent(res.Instance.ID, events.InstanceMachineDestroyed) {
		t.Fatalf("no trail of the destroyed machine: %v", e.eventKinds(res.Instance.ID))
	}
}
