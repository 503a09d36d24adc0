package qemu

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/qemu/qemutest"
)

// TestRealVMWithTPM boots one real VM with --qemu-tpm and no token (a
// tokenless boot: the instance id in fw_cfg, no token entry), checks that
// the guest kernel found the TPM, and that terminate leaves no swtpm but
// keeps the node's TPM. It skips loudly without QEMU, the kernel or swtpm.
func TestRealVMWithTPM(t *testing.T) {
	qemutest.RequireQEMU(t)
	requireSwtpm(t)
	kernel := qemutest.FetchKernel(t)
	initrd := qemutest.TinyInitramfs(t, kernel)
	began := time.Now()

	logger, _ := testLogger(t)
	stateDir := shortTempDir(t)
	p, err := New(Config{Mode: ModeReal, StateDir: stateDir, StopGrace: time.Second, TPM: true, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	const id, node = "vmtpm-1", "node-tpm"
	paths := pathsFor(stateDir, id)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), vmBound)
		defer cancel()
		if err := p.Terminate(ctx, id); err != nil {
			t.Errorf("cleanup terminate: %v", err)
		}
		if pid, _ := readPID(paths.pid); pid > 0 && processIsVM(pid, paths.qmpArg()) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if pid := swtpmOf(stateDir, id); pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if t.Failed() {
			b, _ := os.ReadFile(paths.console)
			t.Logf("console log:\n%s", b)
			b, _ = os.ReadFile(paths.qemuLog)
			t.Logf("qemu log:\n%s", b)
		}
	})
	ek, err := p.PrepareNodeTPM(node)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*vmBound)
	defer cancel()
	boot := providers.Boot{
		KernelPath:    kernel.Path,
		InitramfsPath: initrd,
		// Not quiet: the kernel's TPM lines are what this test reads.
		Enrollment: providers.Enrollment{
			ControlPlaneURL: "https://10.0.2.2:7443",
			CAFingerprint:   "sha256:" + strings.Repeat("ab", 32),
			InstanceID:      id,
		},
	}
	m, err := p.Provision(ctx, providers.Spec{InstanceID: id, Node: node, Boot: boot})
	if err != nil {
		t.Fatalf("provision: %v", err)
	}
	if !strings.Contains(m.Detail, "tpm ek "+ek) {
		t.Fatalf("detail %q lacks EK %s", m.Detail, ek)
	}
	swPID := swtpmOf(stateDir, id)
	if swPID == 0 {
		t.Fatal("no swtpm for the VM")
	}
	waitCtx, waitCancel := context.WithTimeout(ctx, vmBound)
	defer waitCancel()
	if _, err := qemutest.WaitForLine(waitCtx, paths.console, qemutest.TinyInitMarker, 1); err != nil {
		t.Fatalf("boot: %v", err)
	}
	t.Logf("booted with a TPM %.1fs after the test began", time.Since(began).Seconds())
	if got := qemutest.Lines(paths.console, "TETHER-TINYINIT: tpm-device=tpmrm0"); len(got) != 1 {
		t.Fatalf("the guest has no /dev/tpmrm0 (tpm-device lines: %q)", qemutest.Lines(paths.console, "tpm"))
	}
	for _, l := range qemutest.Lines(paths.console, "TPM") {
		t.Logf("console: %s", strings.TrimSpace(l))
	}
	if got := qemutest.Lines(paths.console, "TETHER-TINYINIT: instance="+id); len(got) != 1 {
		t.Fatalf("instance line = %q", got)
	}
	if got := qemutest.Lines(paths.console, "TETHER-TINYINIT: token unreadable"); len(got) != 1 {
		t.Fatalf("a tokenless boot reached a token: %q", qemutest.Lines(paths.console, "token"))
	}
	for _, l := range qemutest.Lines(paths.console, "tpm-eventlog") {
		t.Logf("firmware event log: %s", strings.TrimSpace(l))
	}

	if err := p.Terminate(ctx, id); err != nil {
		t.Fatalf("terminate: %v", err)
	}
	if pid := swtpmOf(stateDir, id); pid != 0 || !qemutest.ProcessGone(swPID) {
		t.Fatalf("swtpm pid %d (was %d) after terminate", pid, swPID)
	}
	if h, err := tpmEKHash(TPMDir(stateDir, node)); err != nil || h != ek {
		t.Fatalf("the node's TPM after terminate: %s, %v", h, err)
	}
	t.Logf("real VM with TPM took %.1fs", time.Since(began).Seconds())
}
