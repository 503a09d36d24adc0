package tasks

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tetherfleet/tether/agent/session"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

func execTask(timeout int32, argv ...string) *tetherv1.TaskAssignment {
	return &tetherv1.TaskAssignment{TaskId: "t", Kind: tetherv1.TaskKind_TASK_KIND_EXEC, Exec: &tetherv1.ExecPayload{Argv: argv, TimeoutSeconds: timeout}}
}

func settings(maxOut int) session.Settings {
	s := session.DefaultSettings()
	s.MaxTaskOutputBytes = maxOut
	return s
}

// gone reports whether pid has exited (or is a zombie about to be reaped).
func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	state, _, _ := parseStat(string(b))
	return state == "Z"
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !gone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d survived the kill of its process group", pid)
		}
		time.Sleep(10 * time.Millisecond) // polls an external process's exit
	}
}

func TestExec(t *testing.T) {
	tests := []struct {
		name      string
		task      *tetherv1.TaskAssignment
		maxOut    int
		wantErr   string
		wantCode  int32
		wantOut   string
		truncated bool
	}{
		{name: "stdout and stderr", task: execTask(0, "sh", "-c", "echo out; echo err >&2"), wantOut: "out\nerr\n"},
		{name: "non-zero exit fails with the result", task: execTask(0, "sh", "-c", "echo partial; exit 3"), wantErr: "exit status 3", wantCode: 3, wantOut: "partial\n"},
		{name: "output capped", task: execTask(0, "sh", "-c", "head -c 10000 /dev/zero | tr '\\0' x"), maxOut: 100, wantOut: strings.Repeat("x", 100), truncated: true},
		{name: "output exactly at the cap", task: execTask(0, "printf", "12345"), maxOut: 5, wantOut: "12345"},
		{name: "missing program", task: execTask(0, "/nonexistent/prog"), wantErr: "no such file", wantCode: -1},
		{name: "empty argv", task: execTask(0), wantErr: "empty argv"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &Executor{Procs: NewRegistry()}
			out := e.Run(context.Background(), tt.task, settings(tt.maxOut))
			if tt.wantErr != "" {
				if out.Err == nil || !strings.Contains(out.Err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", out.Err, tt.wantErr)
				}
			} else if out.Err != nil {
				t.Fatal(out.Err)
			}
			if out.Result == nil {
				if tt.wantOut != "" || tt.wantCode != 0 {
					t.Fatal("no result")
				}
				return
			}
			if got := string(out.Result.Output); got != tt.wantOut {
				t.Errorf("output = %q, want %q", got, tt.wantOut)
			}
			if out.Result.ExitCode != tt.wantCode || out.Result.OutputTruncated != tt.truncated {
				t.Errorf("exit %d truncated %v, want %d %v", out.Result.ExitCode, out.Result.OutputTruncated, tt.wantCode, tt.truncated)
			}
		})
	}
}

// grandchildScript starts a background sleep (a grandchild in the same
// process group), prints its pid, creates the returned file to say so, and
// waits.
func grandchildScript(t *testing.T) (argv []string, ready string) {
	ready = filepath.Join(t.TempDir(), "ready")
	return []string{"sh", "-c", "sleep 300 & echo $!; : >" + ready + "; wait"}, ready
}

// waitFile waits for the shell, an external process, to create path.
func waitFile(t *testing.T, path string) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s never appeared", path)
			return
		}
		time.Sleep(5 * time.Millisecond) // polls an external process
	}
}

func TestExecTimeoutKillsProcessGroup(t *testing.T) {
	var asked time.Duration
	fire := make(chan time.Time)
	e := &Executor{After: func(d time.Duration) <-chan time.Time { asked = d; return fire }}
	argv, ready := grandchildScript(t)
	go func() { waitFile(t, ready); close(fire) }()
	out := e.Run(context.Background(), execTask(0, argv...), settings(0))
	if asked != DefaultExecTimeout {
		t.Errorf("timeout = %v, want the default %v", asked, DefaultExecTimeout)
	}
	if out.Err == nil || !strings.Contains(out.Err.Error(), "timed out after 5m0s") {
		t.Fatalf("err = %v", out.Err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out.Result.Output)))
	if err != nil {
		t.Fatalf("output %q: %v", out.Result.Output, err)
	}
	waitGone(t, pid)

	e.After = func(d time.Duration) <-chan time.Time { asked = d; return nil }
	e.Run(context.Background(), execTask(7, "true"), settings(0))
	if asked != 7*time.Second {
		t.Errorf("timeout = %v, want the task's 7s", asked)
	}
}

func TestExecCancelKillsProcessGroup(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	argv, ready := grandchildScript(t)
	go func() { waitFile(t, ready); cancel(errors.New("cancelled by the control plane")) }()
	out := (&Executor{}).Run(ctx, execTask(0, argv...), settings(0))
	if out.Err == nil || !strings.Contains(out.Err.Error(), "cancelled by the control plane") {
		t.Fatalf("err = %v", out.Err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out.Result.Output)))
	if err != nil {
		t.Fatalf("output %q: %v", out.Result.Output, err)
	}
	waitGone(t, pid)
}

type fakePower struct {
	checkErr error
	mu       sync.Mutex
	did      []string
}

func (p *fakePower) Check() error { return p.checkErr }
func (p *fakePower) Reboot() error {
	p.mu.Lock()
	p.did = append(p.did, "reboot")
	p.mu.Unlock()
	return nil
}
func (p *fakePower) PowerOff() error {
	p.mu.Lock()
	p.did = append(p.did, "poweroff")
	p.mu.Unlock()
	return nil
}
func (p *fakePower) Describe(kind string) string { return kind + "ing" }

func TestPowerActsOnlyAfterReporting(t *testing.T) {
	for _, kind := range []tetherv1.TaskKind{tetherv1.TaskKind_TASK_KIND_REBOOT, tetherv1.TaskKind_TASK_KIND_POWEROFF} {
		p := &fakePower{}
		out := (&Executor{Power: p}).Run(context.Background(), &tetherv1.TaskAssignment{Kind: kind}, settings(0))
		if out.Err != nil || out.Then == nil {
			t.Fatalf("%v: outcome %+v", kind, out)
		}
		if len(p.did) != 0 {
			t.Fatalf("%v: acted before the result was reported", kind)
		}
		out.Then()
		if len(p.did) != 1 {
			t.Fatalf("%v: did %v", kind, p.did)
		}
	}
	out := (&Executor{Power: &fakePower{checkErr: errors.New("not root")}}).Run(context.Background(), &tetherv1.TaskAssignment{Kind: tetherv1.TaskKind_TASK_KIND_REBOOT}, settings(0))
	if out.Err == nil || out.Then != nil {
		t.Fatalf("a reboot that cannot work must fail up front: %+v", out)
	}
}

func TestDryRunPower(t *testing.T) {
	var lines []string
	p := DryRunPower{Logf: func(f string, a ...any) { lines = append(lines, fmt.Sprintf(f, a...)) }}
	out := (&Executor{Power: p}).Run(context.Background(), &tetherv1.TaskAssignment{Kind: tetherv1.TaskKind_TASK_KIND_REBOOT}, settings(0))
	if out.Err != nil || !strings.Contains(string(out.Result.Output), "would reboot") {
		t.Fatalf("outcome %+v", out)
	}
	out.Then()
	if len(lines) != 1 || !strings.Contains(lines[0], "would reboot") || !strings.Contains(lines[0], "--allow-power") {
		t.Fatalf("console = %v", lines)
	}
}

func TestSyncRenewAndUnknown(t *testing.T) {
	e := &Executor{
		Sync:  func(context.Context) (string, error) { return "drift: base:2 differs", errors.New("1 module drifted") },
		Renew: func(context.Context) (string, error) { return "renewed; valid until X", nil },
	}
	out := e.Run(context.Background(), &tetherv1.TaskAssignment{Kind: tetherv1.TaskKind_TASK_KIND_MODULE_SYNC}, settings(0))
	if out.Err == nil || string(out.Result.Output) != "drift: base:2 differs" {
		t.Fatalf("module_sync: %+v", out)
	}
	out = e.Run(context.Background(), &tetherv1.TaskAssignment{Kind: tetherv1.TaskKind_TASK_KIND_RENEW_CERTIFICATE}, settings(0))
	if out.Err != nil || string(out.Result.Output) != "renewed; valid until X" {
		t.Fatalf("renew: %+v", out)
	}
	out = e.Run(context.Background(), &tetherv1.TaskAssignment{Kind: tetherv1.TaskKind_TASK_KIND_PROVISION}, settings(0))
	if out.Err == nil || !strings.Contains(out.Err.Error(), "not one this agent runs") {
		t.Fatalf("worker kind: %+v", out)
	}
}

func TestReapSparesOwnedChildren(t *testing.T) {
	r := NewRegistry()
	// An orphan-like child nobody waits for.
	pid, err := syscall.ForkExec("/bin/true", []string{"true"}, &syscall.ProcAttr{})
	if err != nil {
		t.Skipf("fork: %v", err)
	}
	// An owned child that exits at once.
	cmd := exec.Command("true")
	if err := r.Start(cmd); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !(gone(pid) && gone(cmd.Process.Pid)) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // polls external processes' exit
	}
	if n := r.Reap(""); n != 1 {
		t.Fatalf("reaped %d, want the one unowned zombie", n)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); !os.IsNotExist(err) {
		t.Fatal("unowned zombie still there")
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("owned child's status was stolen: %v", err)
	}
	r.Release(cmd.Process.Pid)
}

func TestParseStat(t *testing.T) {
	state, ppid, ok := parseStat("123 (a) b (c)) Z 1 123 123 0 -1")
	if !ok || state != "Z" || ppid != 1 {
		t.Fatalf("got %q %d %v", state, ppid, ok)
	}
	if _, _, ok := parseStat("garbage"); ok {
		t.Fatal("parsed garbage")
	}
}
