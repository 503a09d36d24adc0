package libvirt

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/internal/testkit/logbuf"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/libvirt/libvirttest"
	"github.com/tetherfleet/tether/providers/qemu/qemutest"
)

// vmBound bounds every wait on a real domain: a TCG boot of the tiny
// initramfs takes a few seconds here; the margin is for a loaded machine.
const vmBound = 90 * time.Second

type syncBuffer = logbuf.Buffer

// realFixture is a private libvirtd, the tiny initramfs where its QEMU can
// read it, and a provider on both.
type realFixture struct {
	d              *libvirttest.Daemon
	p              *Provider
	kernel, initrd string
	logs           *syncBuffer
}

func newRealFixture(t *testing.T, mods ...func(*Config)) *realFixture {
	t.Helper()
	d := libvirttest.Start(t)
	kernel := qemutest.FetchKernel(t)
	initrd := qemutest.TinyInitramfs(t, kernel)
	// The initramfs sits in the test's private temp dir, where the
	// daemon's user cannot read it: the provider stages its own copies.
	f := &realFixture{d: d, kernel: kernel.Path, initrd: initrd, logs: &syncBuffer{}}
	cfg := Config{URI: d.URI, StateDir: d.StateDir, FileOwner: d.Owner, DomainType: DomainTypeAuto,
		StopGrace: time.Second, Logger: slog.New(slog.NewTextHandler(f.logs, nil))}
	for _, m := range mods {
		m(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.p = p
	return f
}

func (f *realFixture) boot(token string) providers.Boot {
	return providers.Boot{
		KernelPath:    f.kernel,
		InitramfsPath: f.initrd,
		KernelArgs:    "quiet",
		Signers:       []string{"sha256:" + strings.Repeat("cd", 32)},
		Enrollment: providers.Enrollment{
			ControlPlaneURL: "https://10.0.2.2:7443",
			Token:           token,
			CAFingerprint:   "sha256:" + strings.Repeat("ab", 32),
		},
	}
}

// TestRealLibvirtDirectBoot boots a domain through a private libvirtd from
// the Debian cloud kernel and the tiny initramfs, checks the enrollment
// data reached the guest through fw_cfg (and the token nowhere else), then
// stops, starts, reboots and terminates it. It skips only when libvirtd or
// QEMU is missing or the kernel cannot be fetched, and says so on stderr.
func TestRealLibvirtDirectBoot(t *testing.T) {
	f := newRealFixture(t)
	const id = "lvtest-1"
	console := f.p.ConsoleLogPath(id)
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(console)
			t.Logf("console log:\n%s", b)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 4*vmBound)
	defer cancel()
	typ, err := f.p.Check(ctx)
	if err != nil {
		t.Fatalf("check: %v", err)
	}
	t.Logf("domain type: %s", typ)

	tok1 := "lvtest-token-one-" + strings.Repeat("1", 32)
	tok2 := "lvtest-token-two-" + strings.Repeat("2", 32)
	tok3 := "lvtest-token-three-" + strings.Repeat("3", 32)

	m, err := f.p.Provision(ctx, providers.Spec{InstanceID: id, Boot: f.boot(tok1)})
	if err != nil {
		t.Fatalf("provision: %v", err)
	}
	if m.State != providers.StateRunning || m.InstanceID != id {
		t.Fatalf("provision = %+v, want running", m)
	}
	waitLine(t, ctx, console, qemutest.TinyInitMarker, 1)
	if got := qemutest.Lines(console, qemutest.TokenDigestPrefix); len(got) != 1 || !strings.HasSuffix(got[0], qemutest.TokenDigest(tok1)) {
		t.Fatalf("token digest lines = %q, want sha256 of token 1", got)
	}
	if got := qemutest.Lines(console, qemutest.URLPrefix); len(got) != 1 || !strings.HasSuffix(got[0], "https://10.0.2.2:7443") {
		t.Fatalf("url lines = %q", got)
	}
	if _, err := os.Stat(filepath.Join(f.d.StateDir, id, tokenFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("token file present while the domain runs: %v", err)
	}
	// The token is in no file libvirtd keeps and in no log of ours.
	if hits := grepTree(t, f.d.Dir, tok1); len(hits) > 0 {
		t.Fatalf("token 1 appears in %v", hits)
	}
	if strings.Contains(f.logs.String(), tok1) {
		t.Fatal("token 1 appears in the provider log")
	}

	// Idempotent: a second provision returns the running domain.
	if m, err := f.p.Provision(ctx, providers.Spec{InstanceID: id, Boot: f.boot(tok1)}); err != nil || m.State != providers.StateRunning {
		t.Fatalf("second provision = %+v, %v", m, err)
	}
	if st, err := f.p.Status(ctx, id); err != nil || st.State != providers.StateRunning || !strings.Contains(st.Detail, DomainName(id)) {
		t.Fatalf("status = %+v, %v", st, err)
	}
	ms, err := f.p.List(ctx)
	if err != nil || len(ms) != 1 || ms[0].InstanceID != id || ms[0].State != providers.StateRunning {
		t.Fatalf("list = %+v, %v", ms, err)
	}

	// Stop: the tiny init has no ACPI handler, so the grace runs out and
	// the domain is destroyed.
	if m, err := f.p.Stop(ctx, id); err != nil || m.State != providers.StateStopped {
		t.Fatalf("stop = %+v, %v", m, err)
	}
	if st, err := f.p.Status(ctx, id); err != nil || st.State != providers.StateStopped {
		t.Fatalf("status after stop = %+v, %v", st, err)
	}
	if m, err := f.p.Stop(ctx, id); err != nil || m.State != providers.StateStopped {
		t.Fatalf("second stop = %+v, %v", m, err)
	}
	// Provision does not reboot a domain that has run and been stopped.
	if m, err := f.p.Provision(ctx, providers.Spec{InstanceID: id, Boot: f.boot(tok1)}); err != nil || m.State != providers.StateStopped {
		t.Fatalf("provision of a stopped domain = %+v, %v", m, err)
	}

	// Start: a fresh boot with a fresh token.
	if m, err := f.p.Start(ctx, id, f.boot(tok2)); err != nil || m.State != providers.StateRunning {
		t.Fatalf("start = %+v, %v", m, err)
	}
	waitLine(t, ctx, console, qemutest.TinyInitMarker, 2)
	if got := qemutest.Lines(console, qemutest.TokenDigestPrefix); len(got) != 2 || !strings.HasSuffix(got[1], qemutest.TokenDigest(tok2)) {
		t.Fatalf("token digest lines after start = %q, want token 2 second", got)
	}
	if m, err := f.p.Start(ctx, id, f.boot(tok2)); err != nil || m.State != providers.StateRunning {
		t.Fatalf("start of a running domain = %+v, %v", m, err)
	}

	// Reboot: a new QEMU with token 3.
	if m, err := f.p.Reboot(ctx, id, f.boot(tok3)); err != nil || m.State != providers.StateRunning {
		t.Fatalf("reboot = %+v, %v", m, err)
	}
	waitLine(t, ctx, console, qemutest.TinyInitMarker, 3)
	if got := qemutest.Lines(console, qemutest.TokenDigestPrefix); len(got) != 3 || !strings.HasSuffix(got[2], qemutest.TokenDigest(tok3)) {
		t.Fatalf("token digest lines after reboot = %q, want token 3 third", got)
	}

	// Terminate leaves no domain, no NVRAM, no instance directory.
	if err := f.p.Terminate(ctx, id); err != nil {
		t.Fatalf("terminate: %v", err)
	}
	if names := f.d.DomainNames(t); len(names) != 0 {
		t.Fatalf("domains after terminate = %v", names)
	}
	if _, err := os.Stat(filepath.Join(f.d.StateDir, id)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("instance dir after terminate: %v", err)
	}
	if st, err := f.p.Status(ctx, id); err != nil || st.State != providers.StateGone {
		t.Fatalf("status after terminate = %+v, %v", st, err)
	}
	if err := f.p.Terminate(ctx, id); err != nil {
		t.Fatalf("second terminate: %v", err)
	}
	if _, err := f.p.Start(ctx, id, f.boot(tok3)); !providers.IsNotFound(err) {
		t.Fatalf("start after terminate = %v, want not found", err)
	}
}

// TestRealLibvirtForeignDomains plants a domain that is not Tether's and
// one that has Tether's name but no tag: List shows neither, and the
// provider refuses to touch the impostor.
func TestRealLibvirtForeignDomains(t *testing.T) {
	f := newRealFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), vmBound)
	defer cancel()
	l := f.d.Connect(t)
	for _, name := range []string{"someone-else", DomainName("impostor")} {
		x := `<domain type='qemu'><name>` + name + `</name><memory unit='MiB'>64</memory><os><type arch='x86_64'>hvm</type></os></domain>`
		if _, err := l.DomainDefineXML(x); err != nil {
			t.Fatalf("define %s: %v", name, err)
		}
	}
	ms, err := f.p.List(ctx)
	if err != nil || len(ms) != 0 {
		t.Fatalf("list = %+v, %v; want nothing of Tether's", ms, err)
	}
	err = f.p.Terminate(ctx, "impostor")
	if providers.KindOf(err) != providers.KindPermanent || !strings.Contains(err.Error(), "not Tether's") {
		t.Fatalf("terminate of an untagged domain = %v, want a permanent refusal", err)
	}
	if names := f.d.DomainNames(t); !slices.Contains(names, DomainName("impostor")) {
		t.Fatalf("the untagged domain was removed: %v", names)
	}
}

// TestRealLibvirtBadKernel: a kernel QEMU cannot boot leaves nothing behind.
func TestRealLibvirtMissingKernel(t *testing.T) {
	f := newRealFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), vmBound)
	defer cancel()
	b := f.boot("tok-" + strings.Repeat("x", 32))
	b.KernelPath = filepath.Join(f.d.Dir, "no-such-kernel")
	_, err := f.p.Provision(ctx, providers.Spec{InstanceID: "lvtest-bad", Boot: b})
	if providers.KindOf(err) != providers.KindPermanent || !strings.Contains(err.Error(), "kernel") {
		t.Fatalf("provision with a missing kernel = %v, want permanent naming the kernel", err)
	}
	if names := f.d.DomainNames(t); len(names) != 0 {
		t.Fatalf("domains after a refused provision = %v", names)
	}
}

func waitLine(t *testing.T, ctx context.Context, path, substr string, n int) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, vmBound)
	defer cancel()
	if _, err := qemutest.WaitForLine(wctx, path, substr, n); err != nil {
		t.Fatalf("boot %d: %v", n, err)
	}
}

// grepTree returns the files under dir that contain s.
func grepTree(t *testing.T, dir, s string) []string {
	t.Helper()
	var hits []string
	_ = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() || fi.Size() > 64<<20 {
			return nil
		}
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(s)) {
			hits = append(hits, p)
		}
		return nil
	})
	return hits
}

// TestRealLibvirtUEFINVRAM: a UEFI domain gets its own NVRAM from the
// firmware's template, and terminate removes it with the domain.
func TestRealLibvirtUEFINVRAM(t *testing.T) {
	for _, f := range []string{defaultOVMFCode, defaultOVMFVars} {
		if _, err := os.Stat(f); err != nil {
			qemutest.SkipLoudly(t, "%s is missing (install the ovmf package): %v", f, err)
		}
	}
	d := libvirttest.Start(t)
	kernel := qemutest.FetchKernel(t)
	initrd := qemutest.TinyInitramfs(t, kernel)
	p, err := New(Config{URI: d.URI, StateDir: d.StateDir, FileOwner: d.Owner, Firmware: FirmwareUEFI, StopGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*vmBound)
	defer cancel()
	const id = "lvtest-uefi"
	b := providers.Boot{KernelPath: kernel.Path, InitramfsPath: initrd,
		Enrollment: providers.Enrollment{ControlPlaneURL: "https://10.0.2.2:7443", Token: "uefi-token-" + strings.Repeat("u", 32)}}
	if m, err := p.Provision(ctx, providers.Spec{InstanceID: id, Boot: b}); err != nil || m.State != providers.StateRunning {
		t.Fatalf("provision = %+v, %v", m, err)
	}
	nvram := func() []string {
		got, _ := filepath.Glob(filepath.Join(d.Dir, "home", ".config", "libvirt", "qemu", "nvram", "*"))
		return got
	}
	if got := nvram(); len(got) != 1 || !strings.Contains(got[0], DomainName(id)) {
		t.Fatalf("NVRAM files = %v, want the domain's one", got)
	}
	waitLine(t, ctx, p.ConsoleLogPath(id), qemutest.TinyInitMarker, 1)
	if err := p.Terminate(ctx, id); err != nil {
		t.Fatal(err)
	}
	if got := nvram(); len(got) != 0 {
		t.Fatalf("NVRAM left after terminate: %v", got)
	}
	if names := d.DomainNames(t); len(names) != 0 {
		t.Fatalf("domains after terminate = %v", names)
	}
}

// TestRealLibvirtTPM boots a tokenless domain with Config.TPM through a
// private libvirtd: the guest finds /dev/tpmrm0 and its instance id in
// fw_cfg, and after terminate no swtpm of the domain is left.
func TestRealLibvirtTPM(t *testing.T) {
	if _, err := exec.LookPath("swtpm"); err != nil {
		qemutest.SkipLoudly(t, "swtpm not installed (install the swtpm and swtpm-tools packages): %v", err)
	}
	f := newRealFixture(t, func(c *Config) { c.TPM = true })
	const id = "lvtpm-1"
	console := f.p.ConsoleLogPath(id)
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(console)
			t.Logf("console log:\n%s\nprovider log:\n%s", b, f.logs.String())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*vmBound)
	defer cancel()
	b := f.boot("")
	b.Enrollment.InstanceID = id
	if _, err := f.p.Provision(ctx, providers.Spec{InstanceID: id, Boot: b}); err != nil {
		t.Fatalf("provision: %v", err)
	}
	waitLine(t, ctx, console, qemutest.TinyInitMarker, 1)
	if got := qemutest.Lines(console, "TETHER-TINYINIT: tpm-device=tpmrm0"); len(got) != 1 {
		t.Fatalf("the guest has no /dev/tpmrm0 (tpm lines: %q)", qemutest.Lines(console, "tpm"))
	}
	if got := qemutest.Lines(console, "TETHER-TINYINIT: instance="+id); len(got) != 1 {
		t.Fatalf("instance lines = %q", got)
	}
	for _, l := range qemutest.Lines(console, "tpm-eventlog") {
		t.Logf("firmware event log: %s", strings.TrimSpace(l))
	}
	// libvirtd names the swtpm's socket and log after the domain.
	if len(swtpmsOf(DomainName(id))) == 0 {
		t.Fatal("no swtpm runs for the domain")
	}
	if err := f.p.Terminate(ctx, id); err != nil {
		t.Fatalf("terminate: %v", err)
	}
	if left := swtpmsOf(DomainName(id)); len(left) > 0 {
		t.Fatalf("swtpm left after terminate: %v", left)
	}
}

// swtpmsOf lists the swtpm processes whose command line names s.
func swtpmsOf(s string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.Contains(cmd, "swtpm") && strings.Contains(cmd, s) {
			out = append(out, e.Name()+": "+cmd)
		}
	}
	return out
}
