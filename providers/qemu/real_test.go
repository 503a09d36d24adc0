package qemu

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherfleet/tether/providers"
)

// fakeEnv is a real-mode provider whose QEMU is this test binary.
type fakeEnv struct {
	p        *Provider
	stateDir string
	boot     func(token string) providers.Boot
	log      *syncBuffer
}

func newFakeEnv(t *testing.T, mode string, mutate ...func(*Config)) *fakeEnv {
	t.Helper()
	t.Setenv(fakeQEMUEnv, mode)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := shortTempDir(t)
	art := filepath.Join(dir, "artifacts")
	if err := os.MkdirAll(art, 0o755); err != nil {
		t.Fatal(err)
	}
	kernel, initrd := filepath.Join(art, "vmlinuz"), filepath.Join(art, "initramfs")
	for _, f := range []string{kernel, initrd} {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	logger, buf := testLogger(t)
	cfg := Config{
		Mode:          ModeReal,
		Binary:        self,
		StateDir:      filepath.Join(dir, "s"),
		Accel:         AccelTCG,
		StopGrace:     200 * time.Millisecond,
		QMPTimeout:    2 * time.Second,
		LaunchTimeout: 10 * time.Second,
		KillTimeout:   2 * time.Second,
		Logger:        logger,
	}
	for _, m := range mutate {
		m(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := &fakeEnv{p: p, stateDir: cfg.StateDir, log: buf}
	e.boot = func(token string) providers.Boot {
		b := testBoot(token)
		b.KernelPath, b.InitramfsPath = kernel, initrd
		return b
	}
	t.Cleanup(func() { e.killAll(t) })
	return e
}

// killAll makes sure no fake VM outlives its test, whatever failed.
func (e *fakeEnv) killAll(t *testing.T) {
	entries, _ := os.ReadDir(e.stateDir)
	for _, de := range entries {
		if pid := e.pid(de.Name()); pid > 0 && processIsVM(pid, pathsFor(e.stateDir, de.Name()).qmpArg()) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func (e *fakeEnv) pid(id string) int {
	pid, _ := readPID(pathsFor(e.stateDir, id).pid)
	return pid
}

func (e *fakeEnv) file(id, name string) string {
	b, _ := os.ReadFile(filepath.Join(e.stateDir, id, name))
	return string(b)
}

func (e *fakeEnv) digests(id string) []string {
	return strings.Fields(e.file(id, fakeDigestFile))
}

func digestOf(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// alive reads the process's state once: a zombie, or a process reaped
// between two looks, is not alive (kill(pid, 0) then a read of its state
// raced a reaper: the zombie answered the first and was gone for the second).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func mustState(t *testing.T, p *Provider, id string, want providers.MachineState) providers.Machine {
	t.Helper()
	m, err := p.Status(context.Background(), id)
	if err != nil || m.State != want {
		t.Fatalf("status %s = %+v, %v; want %s", id, m, err, want)
	}
	return m
}

func TestRealLifecycleWithFakeQEMU(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t, fakeNormal)
	p, id := e.p, "inst-1"

	m, err := p.Provision(ctx, providers.Spec{InstanceID: id, Boot: e.boot(testToken)})
	if err != nil || m.State != providers.StateRunning || m.ID != id || m.InstanceID != id {
		t.Fatalf("provision = %+v, %v", m, err)
	}
	pid1 := e.pid(id)
	if !alive(pid1) {
		t.Fatalf("pid %d from the pid file is not alive", pid1)
	}
	if _, err := os.Stat(pathsFor(e.stateDir, id).token); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("token file still present after QMP answered: %v", err)
	}
	if d := e.digests(id); len(d) != 1 || d[0] != digestOf(testToken) {
		t.Fatalf("token that reached fw_cfg: %v", d)
	}
	cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid1) + "/cmdline")
	if strings.Contains(string(cmdline), testToken) {
		t.Fatal("token is on the qemu command line")
	}
	if strings.Contains(e.log.String(), testToken) || strings.Contains(e.file(id, qemuLogFile), testToken) {
		t.Fatal("token is in a log")
	}
	if fi, err := os.Stat(pathsFor(e.stateDir, id).dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("instance dir mode = %v, %v", fi, err)
	}
	// The VM runs in its own session, so signals to our process group do
	// not reach it.
	if sid, _ := syscall.Getpgid(pid1); sid != pid1 {
		t.Fatalf("qemu pgid = %d, want its own (%d)", sid, pid1)
	}

	again, err := p.Provision(ctx, providers.Spec{InstanceID: id, Boot: e.boot("tok-ignored")})
	if err != nil || again.State != providers.StateRunning || e.pid(id) != pid1 || len(e.digests(id)) != 1 {
		t.Fatalf("second provision = %+v, %v (pid %d, digests %v)", again, err, e.pid(id), e.digests(id))
	}
	mustState(t, p, id, providers.StateRunning)

	m, err = p.Stop(ctx, id)
	if err != nil || m.State != providers.StateStopped {
		t.Fatalf("stop = %+v, %v", m, err)
	}
	if alive(pid1) {
		t.Fatal("process alive after stop")
	}
	ev := e.file(id, fakeEventsFile)
	if !strings.Contains(ev, "qmp system_powerdown") || !strings.Contains(ev, "exit on quit") {
		t.Fatalf("stop did not go powerdown then quit:\n%s", ev)
	}
	mustState(t, p, id, providers.StateStopped)
	if m, err := p.Stop(ctx, id); err != nil || m.State != providers.StateStopped {
		t.Fatalf("second stop = %+v, %v", m, err)
	}

	m, err = p.Start(ctx, id, e.boot("tok-2"))
	if err != nil || m.State != providers.StateRunning {
		t.Fatalf("start = %+v, %v", m, err)
	}
	pid2 := e.pid(id)
	if pid2 == pid1 || !alive(pid2) {
		t.Fatalf("start pid %d (was %d)", pid2, pid1)
	}
	if d := e.digests(id); len(d) != 2 || d[1] != digestOf("tok-2") {
		t.Fatalf("start did not hand over the new token: %v", d)
	}
	if _, err := p.Start(ctx, id, e.boot("tok-unused")); err != nil || e.pid(id) != pid2 || len(e.digests(id)) != 2 {
		t.Fatalf("start of a running VM relaunched it: %v", err)
	}

	m, err = p.Reboot(ctx, id, e.boot("tok-3"))
	if err != nil || m.State != providers.StateRunning {
		t.Fatalf("reboot = %+v, %v", m, err)
	}
	pid3 := e.pid(id)
	if pid3 == pid2 || alive(pid2) || !alive(pid3) {
		t.Fatalf("reboot: old pid %d alive=%v, new pid %d alive=%v", pid2, alive(pid2), pid3, alive(pid3))
	}
	if d := e.digests(id); len(d) != 3 || d[2] != digestOf("tok-3") {
		t.Fatalf("reboot did not hand over the new token: %v", d)
	}

	list, err := p.List(ctx)
	if err != nil || len(list) != 1 || list[0].ID != id || list[0].State != providers.StateRunning {
		t.Fatalf("list = %+v, %v", list, err)
	}

	if err := p.Terminate(ctx, id); err != nil {
		t.Fatal(err)
	}
	if alive(pid3) {
		t.Fatal("process alive after terminate")
	}
	if _, err := os.Stat(pathsFor(e.stateDir, id).dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("instance dir survived terminate: %v", err)
	}
	if err := p.Terminate(ctx, id); err != nil {
		t.Fatalf("second terminate: %v", err)
	}
	mustState(t, p, id, providers.StateGone)
	if list, _ := p.List(ctx); len(list) != 0 {
		t.Fatalf("list after terminate = %+v", list)
	}
}

func TestRealNotFound(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t, fakeNormal)
	for name, call := range map[string]func() error{
		"start":  func() error { _, err := e.p.Start(ctx, "nope", e.boot("t")); return err },
		"stop":   func() error { _, err := e.p.Stop(ctx, "nope"); return err },
		"reboot": func() error { _, err := e.p.Reboot(ctx, "nope", e.boot("t")); return err },
	} {
		if err := call(); !providers.IsNotFound(err) {
			t.Errorf("%s: %v, want not found", name, err)
		}
	}
	if err := e.p.Terminate(ctx, "nope"); err != nil {
		t.Errorf("terminate of unknown: %v", err)
	}
	mustState(t, e.p, "nope", providers.StateGone)
	for _, bad := range []string{"../etc", "a,b", ""} {
		if _, err := e.p.Status(ctx, bad); providers.KindOf(err) != providers.KindPermanent || err == nil {
			t.Errorf("status %q: %v, want permanent", bad, err)
		}
		if err := e.p.Terminate(ctx, bad); providers.KindOf(err) != providers.KindPermanent || err == nil {
			t.Errorf("terminate %q: %v, want permanent", bad, err)
		}
	}
}

// A restarted control plane builds a new Provider over the same state dir:
// it must find the running VM, report it from QMP, and be able to stop it
// although it is not the VM's parent.
func TestRealRediscoveryAfterRestart(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t, fakeNormal)
	if _, err := e.p.Provision(ctx, providers.Spec{InstanceID: "inst-1", Boot: e.boot("t1")}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.Provision(ctx, providers.Spec{InstanceID: "inst-2", Boot: e.boot("t2")}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.Stop(ctx, "inst-2"); err != nil {
		t.Fatal(err)
	}
	pid := e.pid("inst-1")

	logger, _ := testLogger(t)
	p2, err := New(Config{Mode: ModeReal, Binary: os.Args[0], StateDir: e.stateDir, Accel: AccelTCG, StopGrace: 100 * time.Millisecond, KillTimeout: 2 * time.Second, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	m := mustState(t, p2, "inst-1", providers.StateRunning)
	if !strings.Contains(m.Detail, "pid "+strconv.Itoa(pid)) {
		t.Fatalf("detail %q does not name pid %d", m.Detail, pid)
	}
	mustState(t, p2, "inst-2", providers.StateStopped)
	list, err := p2.List(ctx)
	if err != nil || len(list) != 2 || list[0].State != providers.StateRunning || list[1].State != providers.StateStopped {
		t.Fatalf("list after restart = %+v, %v", list, err)
	}
	if _, err := p2.Provision(ctx, providers.Spec{InstanceID: "inst-1", Boot: e.boot("t-again")}); err != nil || e.pid("inst-1") != pid {
		t.Fatalf("provision after restart relaunched: %v", err)
	}
	if m, err := p2.Stop(ctx, "inst-1"); err != nil || m.State != providers.StateStopped {
		t.Fatalf("stop after restart = %+v, %v", m, err)
	}
	if alive(pid) {
		t.Fatal("VM alive after the new provider stopped it")
	}
}

// A pid file naming a live process that is not this instance's QEMU (the pid
// was reused) must not count as a running VM, and must never be signalled.
func TestRealPidReuseIsNotAVM(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t, fakeNormal)
	p := pathsFor(e.stateDir, "inst-1")
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := writePID(p.pid, os.Getpid()); err != nil {
		t.Fatal(err)
	}
	// A token file left behind by a crash must not survive a look at it.
	if err := writeSecret(p.token, testToken); err != nil {
		t.Fatal(err)
	}
	mustState(t, e.p, "inst-1", providers.StateStopped)
	if _, err := os.Stat(p.token); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("leftover token file not removed")
	}
	if err := e.p.Terminate(ctx, "inst-1"); err != nil {
		t.Fatal(err)
	}
	// We are still here, so nobody sent us SIGKILL.
	mustState(t, e.p, "inst-1", providers.StateGone)
}

// A directory without a pid file is an earlier provision that died before
// launching; a retry must launch rather than report a stopped machine.
func TestRealProvisionResumesHalfDoneAttempt(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t, fakeNormal)
	if err := os.MkdirAll(pathsFor(e.stateDir, "inst-1").dir, 0o700); err != nil {
		t.Fatal(err)
	}
	m, err := e.p.Provision(ctx, providers.Spec{InstanceID: "inst-1", Boot: e.boot("t")})
	if err != nil || m.State != providers.StateRunning || !alive(e.pid("inst-1")) {
		t.Fatalf("provision = %+v, %v", m, err)
	}
}

func TestRealStopHonoursPowerdown(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t, fakePowerdown, func(c *Config) { c.StopGrace = 10 * time.Second })
	if _, err := e.p.Provision(ctx, providers.Spec{InstanceID: "inst-1", Boot: e.boot("t")}); err != nil {
		t.Fatal(err)
	}
	if m, err := e.p.Stop(ctx, "inst-1"); err != nil || m.State != providers.StateStopped {
		t.Fatalf("stop = %+v, %v", m, err)
	}
	ev := e.file("inst-1", fakeEventsFile)
	if !strings.Contains(ev, "exit on powerdown") || strings.Contains(ev, "qmp quit") {
		t.Fatalf("a guest that powers down was quit anyway:\n%s", ev)
	}
}

func TestRealStopKillsWhenQuitIgnored(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t, fakeDeaf, func(c *Config) { c.KillTimeout = 300 * time.Millisecond })
	if _, err := e.p.Provision(ctx, providers.Spec{InstanceID: "inst-1", Boot: e.boot("t")}); err != nil {
		t.Fatal(err)
	}
	pid := e.pid("inst-1")
	if m, err := e.p.Stop(ctx, "inst-1"); err != nil || m.State != providers.StateStopped {
		t.Fatalf("stop = %+v, %v", m, err)
	}
	if alive(pid) {
		t.Fatal("deaf qemu survived stop")
	}
	if !strings.Contains(e.log.String(), "SIGKILL") {
		t.Fatalf("no SIGKILL logged:\n%s", e.log.String())
	}
}

func TestRealLaunchFailures(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name     string
		mode     string
		mutate   func(*Config)
		boot     func(e *fakeEnv) providers.Boot
		kind     providers.Kind
		contains string
	}{
		{
			name: "qemu refuses its arguments", mode: fakeFail,
			kind: providers.KindPermanent, contains: "could not load kernel",
		},
		{
			name: "binary missing", mode: fakeNormal,
			mutate: func(c *Config) { c.Binary = "/nonexistent/qemu-system-x86_64" },
			kind:   providers.KindPermanent, contains: "install the qemu-system-x86 package",
		},
		{
			name: "kernel missing", mode: fakeNormal,
			boot: func(e *fakeEnv) providers.Boot { b := e.boot("t"); b.KernelPath = "/nonexistent/vmlinuz"; return b },
			kind: providers.KindPermanent, contains: "kernel",
		},
		{
			name: "qmp never answers", mode: fakeMute,
			mutate: func(c *Config) { c.QMPTimeout = 100 * time.Millisecond; c.LaunchTimeout = 600 * time.Millisecond },
			kind:   providers.KindTransient, contains: "did not answer on QMP",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var mut []func(*Config)
			if tt.mutate != nil {
				mut = append(mut, tt.mutate)
			}
			e := newFakeEnv(t, tt.mode, mut...)
			boot := e.boot(testToken)
			if tt.boot != nil {
				boot = tt.boot(e)
			}
			_, err := e.p.Provision(ctx, providers.Spec{InstanceID: "inst-1", Boot: boot})
			if err == nil || providers.KindOf(err) != tt.kind || !strings.Contains(err.Error(), tt.contains) {
				t.Fatalf("err = %v, want kind %s containing %q", err, tt.kind, tt.contains)
			}
			if strings.Contains(err.Error(), testToken) {
				t.Fatal("token in error")
			}
			// A failed provision leaves nothing behind: the machine is gone.
			if _, err := os.Stat(pathsFor(e.stateDir, "inst-1").dir); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("instance dir left after failed provision: %v", err)
			}
			mustState(t, e.p, "inst-1", providers.StateGone)
		})
	}
}

func TestRealStateDirTooLong(t *testing.T) {
	e := newFakeEnv(t, fakeNormal, func(c *Config) { c.StateDir = filepath.Join(c.StateDir, strings.Repeat("d", 100)) })
	_, err := e.p.Provision(context.Background(), providers.Spec{InstanceID: "inst-1", Boot: e.boot("t")})
	if providers.KindOf(err) != providers.KindPermanent || err == nil || !strings.Contains(err.Error(), "unix socket") {
		t.Fatalf("err = %v", err)
	}
}

// qmpRun must come back within its bound when QEMU accepts the connection and
// then says nothing, and must classify a missing socket.
func TestQMPRunTimeoutAndUnreachable(t *testing.T) {
	dir := shortTempDir(t)
	sock := filepath.Join(dir, "q.sock")
	if _, err := qmpRun(context.Background(), sock, time.Second, "query-status"); !errors.Is(err, errQMPUnreachable) {
		t.Fatalf("missing socket: %v", err)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	done := make(chan error, 1)
	go func() {
		_, err := qmpRun(context.Background(), sock, 100*time.Millisecond, "query-status")
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, errQMPTimeout) {
			t.Fatalf("mute server: %v, want timeout", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("qmpRun not bounded by its timeout")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := qmpRun(ctx, sock, time.Second, "query-status"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled ctx: %v", err)
	}
}

func TestConsoleLogPathReal(t *testing.T) {
	e := newFakeEnv(t, fakeNormal)
	if got, want := e.p.ConsoleLogPath("inst-1"), filepath.Join(e.stateDir, "inst-1", "console.log"); got != want {
		t.Fatalf("ConsoleLogPath = %q, want %q", got, want)
	}
}

// A control plane that died between starting QEMU and writing the pid file
// leaves an orphan VM without a pid file; the next provider must adopt it,
// not boot a second VM beside it.
func TestRealAdoptsVMWithoutPidFile(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t, fakeNormal)
	if _, err := e.p.Provision(ctx, providers.Spec{InstanceID: "inst-1", Boot: e.boot("t")}); err != nil {
		t.Fatal(err)
	}
	pid := e.pid("inst-1")
	if err := os.Remove(pathsFor(e.stateDir, "inst-1").pid); err != nil {
		t.Fatal(err)
	}
	logger, _ := testLogger(t)
	p2, err := New(Config{Mode: ModeReal, Binary: os.Args[0], StateDir: e.stateDir, Accel: AccelTCG, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p2.Provision(ctx, providers.Spec{InstanceID: "inst-1", Boot: e.boot("t2")}); err != nil {
		t.Fatal(err)
	}
	if got := e.pid("inst-1"); got != pid {
		t.Fatalf("pid file = %d, want the adopted %d", got, pid)
	}
	if n := len(e.digests("inst-1")); n != 1 {
		t.Fatalf("%d boots, want 1: a second VM was launched", n)
	}
	if err := p2.Terminate(ctx, "inst-1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "adopted VM to exit", func() bool { return !alive(pid) })
}
