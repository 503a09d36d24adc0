package qemu

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/qemu/qemutest"
)

// vmBound bounds every wait on a real VM. A TCG boot of the tiny initramfs
// takes about 3 s here; the margin is for a loaded 2-core machine.
const vmBound = 60 * time.Second

// TestRealVM boots a real QEMU VM from the Debian cloud kernel and a tiny
// initramfs through the provider, then stops, starts and terminates it. It
// skips only when qemu-system-x86_64 is missing or the kernel cannot be
// fetched, and says so on stderr.
func TestRealVM(t *testing.T) {
	qemutest.RequireQEMU(t)
	kernel := qemutest.FetchKernel(t)
	initrd := qemutest.TinyInitramfs(t, kernel)
	began := time.Now()

	logger, logs := testLogger(t)
	stateDir := shortTempDir(t)
	p, err := New(Config{Mode: ModeReal, StateDir: stateDir, StopGrace: time.Second, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("accelerator: %s", p.Accel())
	const id = "vmtest-1"
	paths := pathsFor(stateDir, id)
	t.Cleanup(func() {
		// Terminate through the provider, then make sure by pid: a VM
		// must never outlive a failed test.
		ctx, cancel := context.WithTimeout(context.Background(), vmBound)
		defer cancel()
		if err := p.Terminate(ctx, id); err != nil {
			t.Errorf("cleanup terminate: %v", err)
		}
		if pid, _ := readPID(paths.pid); pid > 0 && processIsVM(pid, paths.qmpArg()) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if t.Failed() {
			b, _ := os.ReadFile(paths.console)
			t.Logf("console log:\n%s", b)
		}
	})

	boot := func(token string) providers.Boot {
		return providers.Boot{
			KernelPath:    kernel.Path,
			InitramfsPath: initrd,
			KernelArgs:    "quiet",
			Enrollment: providers.Enrollment{
				ControlPlaneURL: "https://10.0.2.2:7443",
				Token:           token,
				CAFingerprint:   "sha256:" + strings.Repeat("ab", 32),
			},
		}
	}
	tok1 := "vmtest-token-one-" + strings.Repeat("1", 32)
	tok2 := "vmtest-token-two-" + strings.Repeat("2", 32)

	ctx, cancel := context.WithTimeout(context.Background(), 4*vmBound)
	defer cancel()

	// Boot 1.
	m, err := p.Provision(ctx, providers.Spec{InstanceID: id, Boot: boot(tok1)})
	if err != nil {
		t.Fatalf("provision: %v", err)
	}
	if m.State != providers.StateRunning {
		t.Fatalf("provision state = %s", m.State)
	}
	pid1, _ := readPID(paths.pid)
	waitCtx, waitCancel := context.WithTimeout(ctx, vmBound)
	defer waitCancel()
	if _, err := qemutest.WaitForLine(waitCtx, paths.console, qemutest.TinyInitMarker, 1); err != nil {
		t.Fatalf("first boot: %v", err)
	}
	t.Logf("first boot reached /init %.1fs after the test began", time.Since(began).Seconds())
	if got := qemutest.Lines(paths.console, qemutest.TokenDigestPrefix); len(got) != 1 || !strings.HasSuffix(got[0], qemutest.TokenDigest(tok1)) {
		t.Fatalf("first boot token digest lines = %q, want sha256 of token 1", got)
	}
	if got := qemutest.Lines(paths.console, qemutest.URLPrefix); len(got) != 1 || !strings.HasSuffix(got[0], "https://10.0.2.2:7443") {
		t.Fatalf("url lines = %q", got)
	}
	if _, err := os.Stat(paths.token); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("token file present while the VM runs: %v", err)
	}
	for _, f := range []string{paths.console, paths.qemuLog} {
		if b, _ := os.ReadFile(f); strings.Contains(string(b), tok1) {
			t.Fatalf("token 1 appears in %s", f)
		}
	}
	if strings.Contains(logs.String(), tok1) {
		t.Fatal("token 1 appears in the provider log")
	}

	// Status comes from QMP.
	st, err := p.Status(ctx, id)
	if err != nil || st.State != providers.StateRunning || !strings.Contains(st.Detail, "qmp status running") {
		t.Fatalf("status = %+v, %v", st, err)
	}

	// A control plane restart: a new provider over the same state dir
	// finds the VM from the pid file and QMP socket.
	p2, err := New(Config{Mode: ModeReal, StateDir: stateDir, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := p2.Status(ctx, id); err != nil || st.State != providers.StateRunning {
		t.Fatalf("status from a restarted provider = %+v, %v", st, err)
	}

	// Stop: the tiny init has no ACPI handler, so this is powerdown, the
	// grace, then quit.
	if m, err := p.Stop(ctx, id); err != nil || m.State != providers.StateStopped {
		t.Fatalf("stop = %+v, %v", m, err)
	}
	// We were its parent and reaped it, so kill -0 must fail outright.
	if err := syscall.Kill(pid1, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("kill -0 %d after stop = %v, want ESRCH", pid1, err)
	}
	if _, err := os.Stat(paths.dir); err != nil {
		t.Fatalf("stop removed the instance dir: %v", err)
	}
	if st, err := p.Status(ctx, id); err != nil || st.State != providers.StateStopped {
		t.Fatalf("status after stop = %+v, %v", st, err)
	}

	// Boot 2 with a fresh token, which must be what the guest reads.
	if m, err := p.Start(ctx, id, boot(tok2)); err != nil || m.State != providers.StateRunning {
		t.Fatalf("start = %+v, %v", m, err)
	}
	pid2, _ := readPID(paths.pid)
	if pid2 == pid1 {
		t.Fatalf("start reused pid %d", pid1)
	}
	waitCtx2, waitCancel2 := context.WithTimeout(ctx, vmBound)
	defer waitCancel2()
	if _, err := qemutest.WaitForLine(waitCtx2, paths.console, qemutest.TinyInitMarker, 2); err != nil {
		t.Fatalf("second boot: %v", err)
	}
	got := qemutest.Lines(paths.console, qemutest.TokenDigestPrefix)
	if len(got) != 2 || !strings.HasSuffix(got[1], qemutest.TokenDigest(tok2)) {
		t.Fatalf("second boot token digest lines = %q, want sha256 of token 2 last", got)
	}

	// Terminate: process gone (kill -0 fails), directory removed.
	if err := p.Terminate(ctx, id); err != nil {
		t.Fatalf("terminate: %v", err)
	}
	if err := syscall.Kill(pid2, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("kill -0 %d after terminate = %v, want ESRCH", pid2, err)
	}
	if _, err := os.Stat(paths.dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("instance dir after terminate: %v", err)
	}
	if st, err := p.Status(ctx, id); err != nil || st.State != providers.StateGone {
		t.Fatalf("status after terminate = %+v, %v", st, err)
	}
	t.Logf("real VM lifecycle took %.1fs", time.Since(began).Seconds())
}
