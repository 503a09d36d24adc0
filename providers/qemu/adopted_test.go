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

}
