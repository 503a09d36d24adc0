package qemu

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherfleet/tether/providers"
)

// A tetherd restarted while its VMs run is not their parent: their exits
// must still be reported at once (issue 25), not left to the next provider
// sync. The first provider here plays the tetherd that died; the second is
// its successor over the same state dir.
func TestRealReportsExitsOfVMsItDidNotStart(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := newFakeEnv(t, fakeNormal)
	for _, id := range []string{"inst-1", "inst-2"} {
		if _, err := e.p.Provision(ctx, providers.Spec{InstanceID: id, Boot: e.boot("t-" + id)}); err != nil {
			t.Fatal(err)
		}
	}
	logger, _ := testLogger(t)
	p2, err := New(Config{Mode: ModeReal, Binary: os.Args[0], StateDir: e.stateDir, Accel: AccelTCG, StopGrace: 100 * time.Millisecond, KillTimeout: 2 * time.Second, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	exits := make(chan providers.Exit, 4)
	p2.WatchExits(ctx, func(x providers.Exit) { exits <- x })

	pid := e.pid("inst-1")
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case x := <-exits:
		if x.InstanceID != "inst-1" || !strings.Contains(x.Detail, "did not start it") {
			t.Fatalf("exit %+v, want inst-1's, saying this tetherd did not start it", x)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the successor never reported the exit of a VM it did not start")
	}
	m := mustState(t, p2, "inst-1", providers.StateStopped)
	if !strings.Contains(m.Detail, "exit status is unknown") {
		t.Errorf("status detail %q does not say what was observed", m.Detail)
	}
	mustState(t, p2, "inst-2", providers.StateRunning)
	// What a claim asks inside its transaction agrees, without the lock.
	if d, ok := p2.Exited("inst-1"); !ok || !strings.Contains(d, "did not start it") {
		t.Errorf("Exited(inst-1) = %q, %v; want the pidfd's exit", d, ok)
	}
	if d, ok := p2.Exited("inst-2"); ok {
		t.Errorf("Exited(inst-2) = %q for a VM that runs", d)
	}
}

// A child QEMU killed behind Tether's back is Exited for its parent from
// the moment it is reaped, and a launch clears it.
func TestRealExitedOfAChild(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := newFakeEnv(t, fakeNormal)
	exits := make(chan providers.Exit, 4)
	e.p.WatchExits(ctx, func(x providers.Exit) { exits <- x })
	if _, err := e.p.Provision(ctx, providers.Spec{InstanceID: "inst-1", Boot: e.boot("t")}); err != nil {
		t.Fatal(err)
	}
	if d, ok := e.p.Exited("inst-1"); ok {
		t.Fatalf("Exited = %q for a VM that runs", d)
	}
	if err := syscall.Kill(e.pid("inst-1"), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exits:
	case <-time.After(30 * time.Second):
		t.Fatal("the child's exit was never reported")
	}
	if d, ok := e.p.Exited("inst-1"); !ok || !strings.Contains(d, "signal") {
		t.Fatalf("Exited = %q, %v; want the signal that killed it", d, ok)
	}
	if _, err := e.p.Start(ctx, "inst-1", e.boot("t2")); err != nil {
		t.Fatal(err)
	}
	if d, ok := e.p.Exited("inst-1"); ok {
		t.Fatalf("Exited = %q after a launch", d)
	}
	if d, ok := e.p.Exited("never-made"); ok {
		t.Fatalf("Exited = %q for a VM that never was", d)
	}
}
