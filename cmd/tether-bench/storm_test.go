package main

import (
	"bufio"
	"context"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/tetherfleet/tether/internal/tools/bench"
)

func TestStormFinishAlignsTheAgentsTimelineOnTheSignal(t *testing.T) {
	killed := time.Unix(1000, 400e6)
	r := &stormReport{KilledUnixMS: killed.UnixMilli(), Points: []stormPoint{{T: 1}, {T: 2}, {T: 3}, {T: 4}}}
	r.finish([]bench.Second{
		{Unix: 990, Reconnects: 50, Connects: 50}, // before the signal: not the storm's
		{Unix: 1001, Reconnects: 2, Failures: 5},
		{Unix: 1002, Reconnects: 8},
		{Unix: 1004, Reconnects: 2, Failures: 1},
	})
	if r.Reconnects != 12 || r.Failures != 6 || r.PeakRate != 8 {
		t.Fatalf("reconnects %d, failures %d, peak %d; want 12, 6, 8", r.Reconnects, r.Failures, r.PeakRate)
	}
	// Seconds 0..4 since the signal: 12 over 5 s.
	if r.MeanRate != 12.0/5 || r.PeakOverMean != 8/(12.0/5) {
		t.Fatalf("mean %.2f, peak/mean %.2f; want 2.40 and 3.33", r.MeanRate, r.PeakOverMean)
	}
	if got := []int{r.Points[0].Reconnects, r.Points[1].Reconnects, r.Points[2].Reconnects, r.Points[3].Reconnects}; got[0] != 2 || got[1] != 8 || got[2] != 0 || got[3] != 2 {
		t.Fatalf("points' reconnects %v, want [2 8 0 2]", got)
	}
}

func TestProcessCommandAndWaitGone(t *testing.T) {
	// The child says it is running before its command line is read:
	// Start returns as soon as execve has swapped the address space, and
	// until the kernel has laid out the new arguments, /proc/PID/cmdline
	// is empty (a third of runs read it so). The shell then waits on its
	// stdin rather than exec another program, which would open that
	// window again.
	const script = "echo running; read line"
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Dir = t.TempDir()
	cmd.Env = []string{"TETHER_TEST=1"}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Skipf("no /bin/sh to play tetherd: %v", err)
	}
	defer cmd.Process.Kill()
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "running\n" {
		t.Fatalf("child said %q, %v; want running", line, err)
	}
	argv, dir, env, err := processCommand(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if len(argv) != 3 || argv[2] != script || dir != cmd.Dir || len(env) != 1 || env[0] != "TETHER_TEST=1" {
		t.Fatalf("read %q in %s with %q; want [/bin/sh -c %q] in %s with [TETHER_TEST=1]", argv, dir, env, script, cmd.Dir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := waitGone(ctx, cmd.Process.Pid, 50*time.Millisecond); err == nil {
		t.Fatal("waitGone returned for a process that is still running")
	}
	if err := syscall.Kill(cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Unreaped, it is a zombie: gone as far as its port is concerned.
	if err := waitGone(ctx, cmd.Process.Pid, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if err := waitGone(ctx, cmd.Process.Pid, time.Second); err != nil {
		t.Fatal(err)
	}
}
