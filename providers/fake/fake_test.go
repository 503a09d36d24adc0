package fake

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/providers"
)

func boot(token string) providers.Boot {
	return providers.Boot{
		KernelPath:    "/k",
		InitramfsPath: "/i",
		Enrollment:    providers.Enrollment{ControlPlaneURL: "https://10.0.2.2:7443", Token: token, CAFingerprint: "sha256:ab"},
	}
}

func provision(t *testing.T, p *Provider, inst, token string) providers.Machine {
	t.Helper()
	m, err := p.Provision(context.Background(), providers.Spec{InstanceID: inst, Boot: boot(token)})
	if err != nil {
		t.Fatalf("provision %s: %v", inst, err)
	}
	return m
}

func TestLifecycleAndIdempotence(t *testing.T) {
	ctx := context.Background()
	p := New()
	m := provision(t, p, "i1", "tok1")
	if m.ID != "fake-i1" || m.InstanceID != "i1" || m.State != providers.StateRunning {
		t.Fatalf("provision = %+v", m)
	}
	// Second provision returns the same machine and hands over no new boot.
	again := provision(t, p, "i1", "tok-ignored")
	if again.ID != m.ID || again.State != m.State || p.Boots(m.ID) != 1 {
		t.Fatalf("second provision = %+v, boots %d", again, p.Boots(m.ID))
	}
	if e, _ := p.Enrollment(m.ID); e.Token != "tok1" {
		t.Fatalf("enrollment token = %q, want tok1", e.Token)
	}

	steps := []struct {
		name  string
		do    func() (providers.Machine, error)
		state providers.MachineState
		token string
		boots int
	}{
		{"start running is a no-op", func() (providers.Machine, error) { return p.Start(ctx, m.ID, boot("tok-unused")) }, providers.StateRunning, "tok1", 1},
		{"stop", func() (providers.Machine, error) { return p.Stop(ctx, m.ID) }, providers.StateStopped, "tok1", 1},
		{"stop again", func() (providers.Machine, error) { return p.Stop(ctx, m.ID) }, providers.StateStopped, "tok1", 1},
		{"start with fresh token", func() (providers.Machine, error) { return p.Start(ctx, m.ID, boot("tok2")) }, providers.StateRunning, "tok2", 2},
		{"reboot with fresh token", func() (providers.Machine, error) { return p.Reboot(ctx, m.ID, boot("tok3")) }, providers.StateRunning, "tok3", 3},
		{"status", func() (providers.Machine, error) { return p.Status(ctx, m.ID) }, providers.StateRunning, "tok3", 3},
	}
	for _, s := range steps {
		got, err := s.do()
		if err != nil || got.State != s.state {
			t.Fatalf("%s: %+v, %v; want state %s", s.name, got, err, s.state)
		}
		if e, _ := p.Enrollment(m.ID); e.Token != s.token {
			t.Fatalf("%s: token %q, want %q", s.name, e.Token, s.token)
		}
		if b := p.Boots(m.ID); b != s.boots {
			t.Fatalf("%s: boots %d, want %d", s.name, b, s.boots)
		}
	}

	for i := range 2 {
		if err := p.Terminate(ctx, m.ID); err != nil {
			t.Fatalf("terminate #%d: %v", i+1, err)
		}
	}
	st, err := p.Status(ctx, m.ID)
	if err != nil || st.State != providers.StateGone {
		t.Fatalf("status after terminate = %+v, %v", st, err)
	}
}

func TestUnknownMachine(t *testing.T) {
	ctx := context.Background()
	p := New()
	ops := []struct {
		op Op
		do func() error
	}{
		{OpStart, func() error { _, err := p.Start(ctx, "nope", boot("t")); return err }},
		{OpStop, func() error { _, err := p.Stop(ctx, "nope"); return err }},
		{OpReboot, func() error { _, err := p.Reboot(ctx, "nope", boot("t")); return err }},
	}
	for _, o := range ops {
		if err := o.do(); !providers.IsNotFound(err) {
			t.Errorf("%s unknown: err = %v, want not found", o.op, err)
		}
	}
	if err := p.Terminate(ctx, "nope"); err != nil {
		t.Errorf("terminate unknown: %v", err)
	}
	if m, err := p.Status(ctx, "nope"); err != nil || m.State != providers.StateGone {
		t.Errorf("status unknown = %+v, %v", m, err)
	}
	if _, err := p.Provision(ctx, providers.Spec{}); providers.KindOf(err) != providers.KindPermanent {
		t.Errorf("provision without id: %v", err)
	}
}

func TestFailNext(t *testing.T) {
	ctx := context.Background()
	for _, kind := range []providers.Kind{providers.KindTransient, providers.KindQuota, providers.KindPermanent} {
		t.Run(string(kind), func(t *testing.T) {
			p := New()
			p.FailNext(OpProvision, 2, kind)
			for i := range 2 {
				_, err := p.Provision(ctx, providers.Spec{InstanceID: "i1"})
				if providers.KindOf(err) != kind {
					t.Fatalf("attempt %d: err = %v, want kind %s", i+1, err, kind)
				}
				var pe *providers.Error
				if !errors.As(err, &pe) || pe.Provider != Name || pe.Op != "provision" {
					t.Fatalf("error not typed: %#v", err)
				}
			}
			if len(p.Machines()) != 0 {
				t.Fatal("a failed provision created a machine")
			}
			if _, err := p.Provision(ctx, providers.Spec{InstanceID: "i1"}); err != nil {
				t.Fatalf("third attempt: %v", err)
			}
			calls := p.CallsFor(OpProvision)
			if len(calls) != 3 || calls[0].Err == nil || calls[1].Err == nil || calls[2].Err != nil {
				t.Fatalf("calls = %+v", calls)
			}
		})
	}
}

func TestFailAlwaysUntilCleared(t *testing.T) {
	ctx := context.Background()
	p := New()
	m := provision(t, p, "i1", "t")
	p.FailAlways(OpTerminate, providers.KindTransient)
	for range 5 {
		if err := p.Terminate(ctx, m.ID); providers.KindOf(err) != providers.KindTransient || err == nil {
			t.Fatalf("terminate err = %v", err)
		}
	}
	if st, _ := p.Status(ctx, m.ID); st.State != providers.StateRunning {
		t.Fatalf("failed terminate changed state to %s", st.State)
	}
	p.ClearFailures(OpStop) // other ops do not clear it
	if err := p.Terminate(ctx, m.ID); err == nil {
		t.Fatal("fault cleared by clearing another op")
	}
	p.ClearFailures()
	if err := p.Terminate(ctx, m.ID); err != nil {
		t.Fatalf("terminate after clear: %v", err)
	}
}

func TestFailAfterEffect(t *testing.T) {
	ctx := context.Background()
	p := New()
	m := provision(t, p, "i1", "t")
	p.Inject(OpTerminate, Fault{Kind: providers.KindTransient, Times: 1, AfterEffect: true, Message: "answer lost"})
	err := p.Terminate(ctx, m.ID)
	if err == nil || providers.KindOf(err) != providers.KindTransient {
		t.Fatalf("err = %v", err)
	}
	if st, _ := p.Status(ctx, m.ID); st.State != providers.StateGone {
		t.Fatalf("after-effect fault did not act: %s", st.State)
	}
}

func TestDelayRespectsContext(t *testing.T) {
	p := New()
	p.SetDelay(OpStatus, time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := p.Status(ctx, "x")
	if providers.KindOf(err) != providers.KindTransient || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want transient wrapping deadline", err)
	}
	p.SetDelay(OpStatus, 0)
	if _, err := p.Status(context.Background(), "x"); err != nil {
		t.Fatal(err)
	}
	p.SetDelay(OpStatus, 10*time.Millisecond)
	start := time.Now()
	if _, err := p.Status(context.Background(), "x"); err != nil {
		t.Fatal(err)
	}
	if time.Since(start) < 10*time.Millisecond {
		t.Fatal("delay not applied")
	}
}

func TestBlock(t *testing.T) {
	p := New()
	m := provision(t, p, "i1", "t")
	if p.Entered(OpTerminate) != nil {
		t.Fatal("Entered of an op that is not blocked is not nil")
	}
	release := p.Block(OpTerminate)
	entered := p.Entered(OpTerminate)
	done := make(chan error, 1)
	go func() { done <- p.Terminate(context.Background(), m.ID) }()
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the terminate never reached the gate")
	}
	select {
	case err := <-done:
		t.Fatalf("terminate returned while blocked: %v", err)
	default:
	}
	if st, _ := p.Status(context.Background(), m.ID); st.State != providers.StateRunning {
		t.Fatal("blocked terminate acted")
	}
	release()
	release()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("terminate still blocked after release")
	}
}

func TestDrift(t *testing.T) {
	ctx := context.Background()
	p := New()
	m := provision(t, p, "i1", "t")

	if !p.Vanish(m.ID) {
		t.Fatal("vanish of existing machine reported false")
	}
	if st, _ := p.Status(ctx, m.ID); st.State != providers.StateGone {
		t.Fatalf("after vanish: %s", st.State)
	}
	if !p.Resurrect(m.ID) {
		t.Fatal("resurrect reported false")
	}
	if st, _ := p.Status(ctx, m.ID); st.State != providers.StateRunning {
		t.Fatalf("after resurrect: %s", st.State)
	}
	if err := p.Terminate(ctx, m.ID); err != nil {
		t.Fatal(err)
	}
	if !p.Resurrect(m.ID) {
		t.Fatal("resurrect after terminate reported false")
	}
	if p.Resurrect("never-existed") {
		t.Fatal("resurrected a machine that never existed")
	}

	p.Plant(providers.Machine{ID: "orphan", InstanceID: "old"})
	list, err := p.List(ctx)
	if err != nil || len(list) != 2 || list[1].ID != "orphan" || list[1].State != providers.StateRunning {
		t.Fatalf("list = %+v, %v", list, err)
	}

	if !p.SetState(m.ID, providers.StatePaused) {
		t.Fatal("SetState reported false")
	}
	if st, _ := p.Status(ctx, m.ID); st.State != providers.StatePaused {
		t.Fatalf("after SetState: %s", st.State)
	}
	if !p.SetState(m.ID, providers.StateGone) {
		t.Fatal("SetState gone reported false")
	}
	if p.SetState(m.ID, providers.StateRunning) {
		t.Fatal("SetState on a gone machine reported true")
	}
	// Drift helpers are not provider calls.
	for _, c := range p.Calls() {
		if c.Op == "" {
			t.Fatalf("drift recorded as call: %+v", c)
		}
	}
}

func TestCallRecords(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	p := New(WithClock(clock.NewFake(at)))
	m := provision(t, p, "i1", "tok1")
	_, _ = p.Stop(ctx, m.ID)
	_, _ = p.Start(ctx, m.ID, boot("tok2"))
	_, _ = p.List(ctx)

	calls := p.Calls()
	want := []Op{OpProvision, OpStop, OpStart, OpList}
	if len(calls) != len(want) {
		t.Fatalf("calls = %+v", calls)
	}
	for i, c := range calls {
		if c.Op != want[i] || !c.At.Equal(at) || c.Err != nil {
			t.Errorf("call %d = %+v, want op %s at %s", i, c, want[i], at)
		}
	}
	if calls[0].Spec == nil || calls[0].Spec.InstanceID != "i1" || calls[0].ID != m.ID {
		t.Errorf("provision record = %+v", calls[0])
	}
	if calls[2].Boot == nil || calls[2].Boot.Enrollment.Token != "tok2" {
		t.Errorf("start record = %+v", calls[2])
	}
	p.ResetCalls()
	if len(p.Calls()) != 0 {
		t.Fatal("ResetCalls kept calls")
	}
}

func TestConcurrentUse(t *testing.T) {
	ctx := context.Background()
	p := New()
	p.FailNext(OpProvision, 10, providers.KindTransient)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			inst := fmt.Sprintf("i%d", i%4)
			for {
				if _, err := p.Provision(ctx, providers.Spec{InstanceID: inst}); err == nil {
					break
				}
			}
			_, _ = p.Stop(ctx, MachineID(inst))
			_, _ = p.Status(ctx, MachineID(inst))
			_, _ = p.List(ctx)
		}()
	}
	wg.Wait()
	if n := len(p.Machines()); n != 4 {
		t.Fatalf("machines = %d, want 4 (provision must be idempotent)", n)
	}
	failed := 0
	for _, c := range p.CallsFor(OpProvision) {
		if c.Err != nil {
			failed++
		}
	}
	if failed != 10 {
		t.Fatalf("failed provisions = %d, want exactly 10", failed)
	}
}
