package e2e

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// `make run` is what a newcomer runs first, and Ctrl-C is how they stop
// it. These tests run scripts/run.sh in its own process group, as a
// terminal would, wait for the instance to run, and deliver SIGINT to the
// whole group. Nothing of the run may remain: no QEMU, no tetherd.
func TestRunScriptCtrlCStopsEverything(t *testing.T) {
	for _, tc := range []struct {
		name string
		// before runs just ahead of the Ctrl-C.
		before   func(t *testing.T, r *scriptRun)
		wantSaid string
		// A crashed tetherd makes the run fail, whether the script or the
		// Ctrl-C notices first.
		mayFail bool
		// piped runs `run.sh 2>&1 | tee`: the Ctrl-C kills tee too, and the
		// cleanup writes into a pipe nobody reads (what it says is then
		// read from the data dir's cleanup.log).
		piped bool
	}{
		{"ctrl-c", func(*testing.T, *scriptRun) {}, "terminated ", false, false},
		// The pipeline's status is tee's, killed by the same Ctrl-C (130);
		// what counts is what is left running and what the cleanup said.
		{"ctrl-c piped through tee", func(*testing.T, *scriptRun) {}, "terminated ", true, true},
		{"tetherd died first", func(t *testing.T, r *scriptRun) {
			// A crash: tetherd is gone before the cleanup can ask it for
			// anything, and the VMs (in their own session) live on.
			if err := syscall.Kill(r.tetherd, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			waitGone(t, []int{r.tetherd}, time.Minute)
		}, "is still running; stopping it", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startRunScript(t, tc.piped, filepath.Join(t.TempDir(), "data"), "", runningLine)
			tc.before(t, r)
			if err := r.interrupt(t); err != nil && !tc.mayFail {
				t.Fatalf("run.sh after Ctrl-C: %v\n%s", err, r.out.String())
			}
			out := r.out.String()
			if left := processesMentioning(r.machines); len(left) > 0 {
				t.Fatalf("QEMU of this run still alive after Ctrl-C: pids %v\n%s", left, out)
			}
			if alive(r.tetherd) {
				t.Fatalf("tetherd (pid %d) still alive after Ctrl-C\n%s", r.tetherd, out)
			}
			if tc.piped {
				b, err := os.ReadFile(filepath.Join(r.data, "cleanup.log"))
				if err != nil {
					t.Fatalf("the piped run's cleanup left no log: %v\n%s", err, out)
				}
				out = string(b)
			}
			if !strings.Contains(out, tc.wantSaid) || !strings.Contains(out, "==> stopped") {
				t.Fatalf("run.sh output lacks %q and \"stopped\":\n%s", tc.wantSaid, out)
			}
		})
	}
}

// When tetherd dies under a running `make run`, the run says so, stops the
// VMs tetherd left behind, and fails: no Ctrl-C needed, nothing left.
// Killed or stopped cleanly by someone else, tetherd ending is the run
// failing.
func TestRunScriptStopsWhenTetherdDies(t *testing.T) {
	for _, tc := range []struct {
		name string
		sig  syscall.Signal
		how  string
	}{
		{"killed", syscall.SIGKILL, "killed by signal 9"},
		{"stopped cleanly", syscall.SIGTERM, "with status 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startRunScript(t, false, filepath.Join(t.TempDir(), "data"), "", runningLine)
			if err := syscall.Kill(r.tetherd, tc.sig); err != nil {
				t.Fatal(err)
			}
			err := r.wait(t, "tetherd's end")
			out := r.out.String()
			if err == nil {
				t.Fatalf("run.sh exited 0 although tetherd ended:\n%s", out)
			}
			if left := processesMentioning(r.machines); len(left) > 0 {
				t.Fatalf("QEMU of this run still alive after tetherd ended: pids %v\n%s", left, out)
			}
			for _, want := range []string{"tetherd exited on its own (" + tc.how + ")", "is still running; stopping it", "==> stopped"} {
				if !strings.Contains(out, want) {
					t.Fatalf("run.sh output lacks %q:\n%s", want, out)
				}
			}
		})
	}
}

// A pool's replenisher would replace the VMs the Ctrl-C terminates, so the
// cleanup pauses the active pools; the next run resumes those, and only
// those: a pool the operator paused stays paused.
func TestRunScriptResumesThePoolsItPaused(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	r := startRunScript(t, false, data, "", runningLine)
	// Target 0: pools that cost no VM.
	r.ctl(t, "pool", "create", "busy", "--template", "example", "--provider", "qemu", "--target", "0")
	r.ctl(t, "pool", "create", "held", "--template", "example", "--provider", "qemu", "--target", "0")
	r.ctl(t, "pool", "pause", "held")
	r.ctrlC(t)

	again := startRunScript(t, false, data, r.addr, "resuming pool")
	busy := again.ctl(t, "pool", "get", "busy", "-o", "json")
	held := again.ctl(t, "pool", "get", "held", "-o", "json")
	again.ctrlC(t)
	said := again.out.String()
	if !strings.Contains(said, "resuming pool busy (paused when the last run stopped)") || strings.Contains(said, "resuming pool held") {
		t.Fatalf("the second run should resume busy and only busy:\n%s", said)
	}
	for _, c := range []struct{ got, want string }{{busy, "POOL_STATUS_ACTIVE"}, {held, "POOL_STATUS_PAUSED"}} {
		if !regexp.MustCompile(`"status":\s*"` + c.want + `"`).MatchString(c.got) {
			t.Fatalf("after the second run's start, want %s:\n%s", c.want, c.got)
		}
	}
}

// ctl runs the run's bin/tetherctl as its admin and returns its stdout.
func (r *scriptRun) ctl(t *testing.T, args ...string) string {
	t.Helper()
	args = append([]string{"--config", filepath.Join(r.data, "admin", "tetherconfig.yaml"), "--endpoint", r.addr}, args...)
	cmd := exec.Command(filepath.Join(r.cmd.Dir, "bin", "tetherctl"), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tetherctl %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

// interrupt sends the run's process group SIGINT, as a terminal's Ctrl-C
// does, and returns how the script exited after its cleanup.
func (r *scriptRun) interrupt(t *testing.T) error {
	t.Helper()
	if err := syscall.Kill(-r.cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	return r.wait(t, "Ctrl-C")
}

// wait returns how the script exited, and fails the test, naming what
// still holds the run, if it has not ended within 2 minutes of after.
func (r *scriptRun) wait(t *testing.T, after string) error {
	t.Helper()
	exited := make(chan error, 1)
	go func() { exited <- r.cmd.Wait() }()
	select {
	case err := <-exited:
		return err
	case <-time.After(2 * time.Minute):
		t.Fatalf("run.sh did not end within 2 minutes of %s; still alive, in its group or holding its output:\n%s\nits output:\n%s", after, r.holders(), r.out.String())
		return nil
	}
}

// ctrlC is interrupt for a run that must exit cleanly.
func (r *scriptRun) ctrlC(t *testing.T) {
	t.Helper()
	if err := r.interrupt(t); err != nil {
		t.Fatalf("run.sh after Ctrl-C: %v\n%s", err, r.out.String())
	}
}

type scriptRun struct {
	cmd *exec.Cmd
	// pipe is the run's output pipe ("pipe:[inode]"): cmd.Wait returns
	// only once every process holding it has closed it.
	pipe     string
	data     string
	addr     string
	out      *syncBuffer
	tetherd  int
	machines string
}

// runningLine is what run.sh says once its instance runs.
const runningLine = " is running. Try"

// startRunScript starts scripts/run.sh on data (a new one for each run, or
// an earlier run's) and addr (a free port when ""), and returns once it
// says until.
func startRunScript(t *testing.T, piped bool, data, addr, until string) *scriptRun {
	t.Helper()
	requireVM(t)
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("SKIP (real-VM e2e): setsid (util-linux) is not installed; scripts/run.sh needs it")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if addr == "" {
		addr = freeAddr(t)
	}
	r := &scriptRun{out: &syncBuffer{}, data: data, addr: addr}
	r.cmd = exec.Command("bash", filepath.Join(root, "scripts", "run.sh"))
	if piped {
		// As typed: make run 2>&1 | tee run.log (tee in the same group).
		r.cmd = exec.Command("bash", "-c", `bash "$0" 2>&1 | tee "$1"`, filepath.Join(root, "scripts", "run.sh"), filepath.Join(t.TempDir(), "run.log"))
	}
	r.cmd.Dir = root
	r.cmd.Env = append(os.Environ(), "TETHER_RUN_DATA="+data, "TETHER_RUN_ADDR="+addr)
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	// Its own process group, as a terminal's foreground job.
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.pipe, _ = os.Readlink("/proc/" + strconv.Itoa(r.cmd.Process.Pid) + "/fd/1")
	// Whatever happens, nothing of this run outlives the test.
	t.Cleanup(func() {
		_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
		pids := processesMentioning(data)
		if r.machines != "" {
			pids = append(pids, processesMentioning(r.machines)...)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})

	// Polling an external process, with a deadline: the script builds,
	// boots a VM under TCG and then prints this line.
	deadline := time.Now().Add(bootTimeout + 5*time.Minute)
	for !strings.Contains(r.out.String(), until) {
		// Nothing is said after the running line: waiting longer is futile.
		if time.Now().After(deadline) || strings.Contains(r.out.String(), runningLine) {
			t.Fatalf("run.sh did not say %q:\n%s", until, r.out.String())
		}
		if r.cmd.ProcessState != nil || !alive(r.cmd.Process.Pid) {
			t.Fatalf("run.sh exited early:\n%s", r.out.String())
		}
		time.Sleep(500 * time.Millisecond)
	}
	for _, pid := range processesMentioning(data) {
		args := cmdline(pid)
		if len(args) > 1 && filepath.Base(args[0]) == "tetherd" && args[1] == "serve" {
			r.tetherd = pid
			for i, a := range args {
				if a == "--qemu-state-dir" && i+1 < len(args) {
					r.machines = args[i+1]
				}
			}
		}
	}
	if r.tetherd == 0 || r.machines == "" {
		t.Fatalf("no tetherd serve of this run (data %s) found", data)
	}
	if until == runningLine && len(processesMentioning(r.machines)) == 0 {
		t.Fatalf("no QEMU of this run is alive before Ctrl-C: the test would prove nothing\n%s", r.out.String())
	}
	return r
}

// holders describes the processes that keep the run from ending: those in
// its process group and those holding its output pipe.
func (r *scriptRun) holders() string {
	var b strings.Builder
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		f := statFields(pid)
		if len(f) < 3 {
			continue
		}
		why := ""
		if f[2] == strconv.Itoa(r.cmd.Process.Pid) {
			why = "in the group"
		}
		fds, _ := os.ReadDir("/proc/" + e.Name() + "/fd")
		for _, fd := range fds {
			if l, _ := os.Readlink("/proc/" + e.Name() + "/fd/" + fd.Name()); r.pipe != "" && l == r.pipe {
				why += " holds the output pipe as fd " + fd.Name()
			}
		}
		if why == "" {
			continue
		}
		wchan, _ := os.ReadFile("/proc/" + e.Name() + "/wchan")
		fmt.Fprintf(&b, "  pid %d ppid %s state %s wchan %s: %s: %s\n", pid, f[1], f[0], wchan, strings.TrimSpace(why), strings.Join(cmdline(pid), " "))
	}
	return b.String()
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// processesMentioning lists the pids whose command line contains s.
func processesMentioning(s string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		for _, a := range cmdline(pid) {
			if strings.Contains(a, s) {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

func cmdline(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return nil
	}
	return strings.Split(string(bytes.TrimRight(b, "\x00")), "\x00")
}

// statFields returns the fields of /proc/pid/stat after the command's
// name: state, ppid, pgrp, ... (nil once pid is gone).
func statFields(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(b[i+1:]))
}

// alive is true while pid exists and is not a zombie.
func alive(pid int) bool {
	f := statFields(pid)
	return len(f) > 0 && f[0] != "Z"
}

func waitGone(t *testing.T, pids []int, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("pid %d still alive after %s", pid, limit)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}
