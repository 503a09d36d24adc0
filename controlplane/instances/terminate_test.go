package instances_test

import (
	"context"
	"strings"
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

// issueCert records a node certificate for the instance, as enrollment does.
func (e *env) issueCert(id store.InstanceID, serial store.CertSerial) {
	e.t.Helper()
	c := &store.Certificate{Serial: serial, InstanceID: id, Kind: store.CertKindNode, Subject: "tether://instance/" + id.String(),
		NotBefore: t0, NotAfter: t0.Add(24 * time.Hour), CreatedAt: t0}
	if err := e.st.CreateCertificate(e.ctx, c); err != nil {
		e.t.Fatal(err)
	}
}

// identityEnded checks that the instance's certificates are revoked and
// its tokens can no longer be used.
func (e *env) identityEnded(id store.InstanceID, serials ...store.CertSerial) {
	e.t.Helper()
	for _, s := range serials {
		c, err := e.st.GetCertificate(e.ctx, s)
		if err != nil || c.RevokedAt == nil {
			e.t.Fatalf("certificate %s not revoked: %+v %v", s, c, err)
		}
	}
	tok, _, err := e.svc.IssueToken(e.ctx, id, 0)
	if err == nil || tok != "" {
		e.t.Fatal("a terminated instance was issued a token")
	}
}

func TestTerminate(t *testing.T) {
	e := newEnv(t)
	in := e.running()
	e.issueCert(in.ID, "c1")
	spare, _, err := e.svc.IssueToken(e.ctx, in.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	agentTask := &store.Task{Target: store.TaskTargetAgent, InstanceID: in.ID, Kind: "exec", Payload: []byte(`{"argv":["true"]}`),
		Status: store.TaskPending, MaxAttempts: 3, CreatedAt: t0, UpdatedAt: t0}
	if err := e.st.CreateTask(e.ctx, agentTask); err != nil {
		t.Fatal(err)
	}
	revoked, stop := e.st.Subscribe(store.ChannelRevocations)
	defer stop()

	got, err := e.svc.Terminate(e.ctx, in.ID)
	if err != nil || got.Status != lifecycle.Terminated {
		t.Fatalf("terminate: %v %v", got, err)
	}
	if len(e.fake.Machines()) != 0 {
		t.Fatal("the machine survived its terminate")
	}
	e.identityEnded(in.ID, "c1")
	if _, err := e.st.ConsumeToken(e.ctx, pki.HashToken(spare), "", e.clk.Now()); err == nil {
		t.Fatal("an unused token of a terminated instance was still accepted")
	}
	select {
	case serial := <-revoked:
		if serial != "c1" {
			t.Fatalf("revocation notice for %q", serial)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("open streams were not told of the revocation")
	}
	if e.openTasks(in.ID) != 0 {
		t.Fatal("a terminated instance kept open tasks")
	}
	kinds := e.eventKinds(in.ID)
	for _, k := range []store.EventKind{events.InstanceTerminateRequested, events.InstanceTerminated} {
		if !e.hasEvent(in.ID, k) {
			t.Fatalf("no %s: %v", k, kinds)
		}
	}
}

func TestTerminateFailures(t *testing.T) {
	tests := []struct {
		name   string
		faults map[fake.Op]fake.Fault
		code   codes.Code
		// terminated: the outcome judged by the observed state.
		terminated bool
		event      store.EventKind
	}{
		{"provider refuses", map[fake.Op]fake.Fault{fake.OpTerminate: {Kind: providers.KindTransient, Message: "api down"}},
			codes.Unavailable, false, events.InstanceTerminateFailed},
		{"permanent", map[fake.Op]fake.Fault{fake.OpTerminate: {Kind: providers.KindPermanent, Message: "locked"}},
			codes.FailedPrecondition, false, events.InstanceTerminateFailed},
		{"and status fails", map[fake.Op]fake.Fault{fake.OpTerminate: {Kind: providers.KindTransient}, fake.OpStatus: {Kind: providers.KindTransient}},
			codes.Unavailable, false, events.InstanceTerminateFailed},
		{"acted, answer lost", map[fake.Op]fake.Fault{fake.OpTerminate: {Kind: providers.KindTransient, AfterEffect: true, Times: 1}},
			codes.OK, true, events.InstanceProviderAnswerLost},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			in := e.running()
			e.issueCert(in.ID, "c1")
			for op, f := range tc.faults {
				e.fake.Inject(op, f)
			}
			_, err := e.svc.Terminate(e.ctx, in.ID)
			wantCode(t, err, tc.code)
			got := e.get(in.ID)
			if !e.hasEvent(in.ID, tc.event) {
				t.Fatalf("no %s: %v", tc.event, e.eventKinds(in.ID))
			}
			if tc.terminated {
				if got.Status != lifecycle.Terminated {
					t.Fatalf("instance %s", got.Status)
				}
				e.identityEnded(in.ID, "c1")
				return
			}
			// Not terminated, the intent withdrawn, the identity intact,
			// and the reason on the instance.
			c, _ := e.st.GetCertificate(e.ctx, "c1")
			if got.Status != lifecycle.Running || got.TerminateRequestedAt != nil || c.RevokedAt != nil ||
				!strings.Contains(got.ErrorMessage, "terminate failed") || len(e.fake.Machines()) != 1 {
				t.Fatalf("after a failed terminate: %s intent %v revoked %v error %q machines %d",
					got.Status, got.TerminateRequestedAt, c.RevokedAt, got.ErrorMessage, len(e.fake.Machines()))
			}
			// The operator can try again once the provider recovers.
			e.fake.ClearFailures()
			if _, err := e.svc.Terminate(e.ctx, in.ID); err != nil {
				t.Fatal(err)
			}
			e.identityEnded(in.ID, "c1")
		})
	}
}

// A control plane that dies between the terminate's intent and the
// provider's destroy: the next one finishes the job at start-up.
func TestTerminateResumesAfterACrash(t *testing.T) {
	e := newEnv(t)
	in := e.running()
	e.issueCert(in.ID, "c1")
	release := e.fake.Block(fake.OpTerminate)
	ctx, crash := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { _, err := e.svc.Terminate(ctx, in.ID); done <- err }()
	inFlight(t, e.fake, fake.OpTerminate)
	if e.get(in.ID).TerminateRequestedAt == nil {
		t.Fatal("terminate in flight without its recorded intent")
	}
	crash() // the process dies with the destroy in flight
	if err := <-done; err == nil {
		t.Fatal("an interrupted terminate reported success")
	}
	release()
	got := e.get(in.ID)
	if got.Status != lifecycle.Running || got.TerminateRequestedAt == nil || len(e.fake.Machines()) != 1 {
		t.Fatalf("after the crash: %s, intent %v, %d machines", got.Status, got.TerminateRequestedAt, len(e.fake.Machines()))
	}

	// A new control plane over the same store. The periodic pass leaves a
	// young intent alone; the start-up pass (or time) resumes it.
	fresh := *e.svc
	fresh.Owner = "api-after-restart"
	if n, err := fresh.ResumeTerminates(e.ctx, time.Minute); n != 0 || err != nil {
		t.Fatalf("periodic pass resumed a fresh intent: %d %v", n, err)
	}
	e.clk.Advance(2 * time.Minute)
	if n, err := fresh.ResumeTerminates(e.ctx, time.Minute); n != 1 || err != nil {
		t.Fatalf("resume: %d %v", n, err)
	}
	if got := e.get(in.ID); got.Status != lifecycle.Terminated || len(e.fake.Machines()) != 0 {
		t.Fatalf("after resume: %s, %d machines", got.Status, len(e.fake.Machines()))
	}
	e.identityEnded(in.ID, "c1")
	if n, err := fresh.ResumeTerminates(e.ctx, 0); n != 0 || err != nil {
		t.Fatalf("a second pass found work: %d %v", n, err)
	}
}

func TestTerminateFromEveryNonTerminalState(t *testing.T) {
	for _, st := range []lifecycle.State{lifecycle.Pending, lifecycle.Provisioning, lifecycle.Starting, lifecycle.Stopping,
		lifecycle.Stopped, lifecycle.Rebooting, lifecycle.Error} {
		t.Run(string(st), func(t *testing.T) {
			e := newEnv(t)
			in := e.provision()
			e.setStatus(in.ID, st)
			if got, err := e.svc.Terminate(e.ctx, in.ID); err != nil || got.Status != lifecycle.Terminated {
				t.Fatalf("%v %v", got, err)
			}
			if len(e.fake.Machines()) != 0 {
				t.Fatal("machine left")
			}
		})
	}
}

// A machine whose provision answer was lost is still found and destroyed.
func TestTerminateFindsAnUnrecordedMachine(t *testing.T) {
	e := newEnv(t)
	res, err := e.svc.Provision(e.ctx, instances.ProvisionParams{Node: e.node.Name, Provider: fake.Name})
	if err != nil {
		t.Fatal(err)
	}
	e.fake.Plant(providers.Machine{ID: "elsewhere-1", InstanceID: res.Instance.ID.String()})
	if _, err := e.svc.Terminate(e.ctx, res.Instance.ID); err != nil {
		t.Fatal(err)
	}
	if len(e.fake.Machines()) != 0 {
		t.Fatal("the unrecorded machine survived")
	}
}

func TestExternalInstances(t *testing.T) {
	e := newEnv(t)
	res, err := e.svc.Provision(e.ctx, instances.ProvisionParams{Node: e.node.Name, Provider: "external"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Token == "" || res.TaskID != "" || res.Instance.Status != lifecycle.Provisioning || res.Instance.CloudInstanceID == "" {
		t.Fatalf("external provision: token %v task %q status %s machine %q", res.Token != "", res.TaskID, res.Instance.Status, res.Instance.CloudInstanceID)
	}
	if err := e.svc.AgentReady(e.ctx, res.Instance.ID); err != nil {
		t.Fatal(err)
	}
	// The provider cannot power the machine: said plainly, nothing moves.
	_, err = e.svc.Stop(e.ctx, res.Instance.ID)
	wantCode(t, err, codes.FailedPrecondition)
	if got := e.get(res.Instance.ID); got.Status != lifecycle.Running || got.ErrorMessage != "" {
		t.Fatalf("an unsupported stop changed the instance: %s %q", got.Status, got.ErrorMessage)
	}
	if !e.hasEvent(res.Instance.ID, events.InstanceProviderFailed) {
		t.Fatal("no event for the refused stop")
	}
	if got, err := e.svc.Terminate(e.ctx, res.Instance.ID); err != nil || got.Status != lifecycle.Terminated {
		t.Fatalf("terminate external: %v %v", got, err)
	}
}

// Without a recorded machine, a provider that cannot list leaves it
// unknown whether a machine exists: the terminate fails rather than guess.
func TestTerminateWithoutAMachineRecordAndNoList(t *testing.T) {
	e := newEnv(t)
	res, err := e.svc.Provision(e.ctx, instances.ProvisionParams{Node: e.node.Name, Provider: fake.Name})
	if err != nil {
		t.Fatal(err)
	}
	e.fake.FailNext(fake.OpList, 1, providers.KindTransient)
	_, err = e.svc.Terminate(e.ctx, res.Instance.ID)
	wantCode(t, err, codes.Unavailable)
	if got := e.get(res.Instance.ID); got.Status != lifecycle.Pending || got.TerminateRequestedAt != nil {
		t.Fatalf("after a blind terminate: %s intent %v", got.Status, got.TerminateRequestedAt)
	}
	if _, err := e.svc.Terminate(e.ctx, res.Instance.ID); err != nil {
		t.Fatal(err)
	}
}
