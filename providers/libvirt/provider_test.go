package libvirt

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/providers"
)

type unitFixture struct {
	lv     *fakeLibvirtd
	p      *Provider
	clk    *clock.Fake
	dir    string
	kernel string
	initrd string
}

func newUnit(t *testing.T, mod func(*Config)) *unitFixture {
	t.Helper()
	dir := t.TempDir()
	f := &unitFixture{lv: newFakeLibvirtd(), clk: clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)), dir: dir,
		kernel: filepath.Join(dir, "vmlinuz"), initrd: filepath.Join(dir, "initrd")}
	for _, p := range []string{f.kernel, f.initrd} {
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := Config{URI: "qemu:///system", StateDir: filepath.Join(dir, "state"), Clock: f.clk}
	if mod != nil {
		mod(&cfg)
	}
	p, err := newProvider(cfg, f.lv.dial)
	if err != nil {
		t.Fatal(err)
	}
	f.p = p
	return f
}

func (f *unitFixture) boot(token string) providers.Boot {
	return providers.Boot{KernelPath: f.kernel, InitramfsPath: f.initrd, KernelArgs: "quiet",
		KernelURL: "http://10.0.2.2:8080/boot/kernel",
		Enrollment: providers.Enrollment{ControlPlaneURL: "https://10.0.2.2:7443", Token: token,
			CAFingerprint: "sha256:" + strings.Repeat("ab", 32)}}
}

var ctx = context.Background()

func TestProvisionDefinesTagsAndBoots(t *testing.T) {
	f := newUnit(t, nil)
	tok := "token-" + strings.Repeat("a", 40)
	m, err := f.p.Provision(ctx, providers.Spec{InstanceID: "i-1", Boot: f.boot(tok)})
	if err != nil {
		t.Fatal(err)
	}
	if m.State != providers.StateRunning || m.ID != "i-1" || m.InstanceID != "i-1" {
		t.Fatalf("machine = %+v", m)
	}
	d := f.lv.domain("tether-i-1")
	if d == nil {
		t.Fatal("no domain tether-i-1")
	}
	for _, want := range []string{`type="qemu"`, MetadataNS, ">i-1<", "opt/tether/url", "opt/tether/token", f.kernel} {
		if !strings.Contains(d.xml, want) {
			t.Errorf("definition lacks %q:\n%s", want, d.xml)
		}
	}
	if strings.Contains(d.xml, tok) {
		t.Fatal("the token is in the domain definition")
	}
	if !slices.Equal(f.lv.tokens, []string{tok}) {
		t.Fatalf("QEMU read tokens %q, want the one", f.lv.tokens)
	}
	if _, err := os.Stat(filepath.Join(f.p.cfg.StateDir, "i-1", tokenFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("token file left after boot: %v", err)
	}
	// Idempotent.
	if m, err := f.p.Provision(ctx, providers.Spec{InstanceID: "i-1", Boot: f.boot(tok)}); err != nil || m.State != providers.StateRunning {
		t.Fatalf("second provision = %+v, %v", m, err)
	}
	if n := len(f.lv.callsOf("Create")); n != 1 {
		t.Fatalf("%d creates, want 1", n)
	}
	// The domain type was asked once, then remembered.
	f.p.Provision(ctx, providers.Spec{InstanceID: "i-2", Boot: f.boot(tok)})
	if n := len(f.lv.callsOf("Capabilities")); n != 1 {
		t.Fatalf("%d capability calls, want 1", n)
	}
}

func TestProvisionBootsADefinitionAnEarlierAttemptLeft(t *testing.T) {
	f := newUnit(t, nil)
	f.lv.plant("tether-i-1", `<tether:instance xmlns:tether="`+MetadataNS+`">i-1</tether:instance>`, golibvirt.DomainShutoff)
	uuid := f.lv.domain("tether-i-1").uuid
	m, err := f.p.Provision(ctx, providers.Spec{InstanceID: "i-1", Boot: f.boot("t-" + strings.Repeat("b", 20))})
	if err != nil || m.State != providers.StateRunning {
		t.Fatalf("provision = %+v, %v", m, err)
	}
	if got := f.lv.domain("tether-i-1").uuid; got != uuid {
		t.Fatalf("uuid changed from %s to %s", uuid, got)
	}
}

func TestProvisionFailures(t *testing.T) {
	cases := []struct {
		name     string
		setup    func(f *unitFixture)
		spec     func(f *unitFixture) providers.Spec
		kind     providers.Kind
		contains string
		// leftDomain: whether a domain may remain.
		leftDomain bool
	}{
		{name: "invalid id", spec: func(f *unitFixture) providers.Spec {
			return providers.Spec{InstanceID: "../x", Boot: f.boot("t")}
		}, kind: providers.KindPermanent, contains: "invalid instance id"},
		{name: "no kernel", spec: func(f *unitFixture) providers.Spec {
			b := f.boot("t")
			b.KernelPath = filepath.Join(f.dir, "missing")
			return providers.Spec{InstanceID: "i-1", Boot: b}
		}, kind: providers.KindPermanent, contains: "kernel"},
		{name: "libvirtd away", setup: func(f *unitFixture) {
			f.lv.dialErr = errors.New("connect to libvirtd (socket /var/run/libvirt/libvirt-sock): connection refused")
		}, kind: providers.KindTransient, contains: "connection refused"},
		{name: "definition refused", setup: func(f *unitFixture) {
			f.lv.failNext("DefineXML", lverr(golibvirt.ErrXMLDetail, "XML error: bad thing"))
		}, kind: providers.KindPermanent, contains: "define domain: XML error"},
		{name: "QEMU does not start", setup: func(f *unitFixture) {
			f.lv.failNext("Create", lverr(golibvirt.ErrInternalError, "process exited while connecting to monitor: Permission denied"))
		}, kind: providers.KindTransient, contains: "--libvirt-file-owner"},
		{name: "name taken by an untagged domain", setup: func(f *unitFixture) {
			f.lv.plant("tether-i-1", "", golibvirt.DomainRunning)
		}, kind: providers.KindPermanent, contains: "not Tether's", leftDomain: true},
		{name: "name taken by another instance's domain", setup: func(f *unitFixture) {
			f.lv.plant("tether-i-1", `<tether:instance xmlns:tether="`+MetadataNS+`">i-2</tether:instance>`, golibvirt.DomainRunning)
		}, kind: providers.KindPermanent, contains: "not Tether's", leftDomain: true},
		{name: "out of memory", setup: func(f *unitFixture) {
			f.lv.failNext("Create", lverr(golibvirt.ErrNoMemory, "out of memory"))
		}, kind: providers.KindQuota},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newUnit(t, nil)
			if tc.setup != nil {
				tc.setup(f)
			}
			spec := providers.Spec{InstanceID: "i-1", Boot: f.boot("t-" + strings.Repeat("c", 20))}
			if tc.spec != nil {
				spec = tc.spec(f)
			}
			_, err := f.p.Provision(ctx, spec)
			if err == nil {
				t.Fatal("provision succeeded")
			}
			if k := providers.KindOf(err); k != tc.kind {
				t.Fatalf("kind = %s, want %s: %v", k, tc.kind, err)
			}
			if !strings.Contains(err.Error(), tc.contains) {
				t.Fatalf("error %q does not say %q", err, tc.contains)
			}
			if d := f.lv.domain("tether-i-1"); d != nil && !tc.leftDomain {
				t.Fatalf("a failed provision left domain %+v", d)
			}
			if _, err := os.Stat(filepath.Join(f.p.cfg.StateDir, "i-1")); !tc.leftDomain && !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("a failed provision left its instance dir: %v", err)
			}
		})
	}
}

func TestStop(t *testing.T) {
	t.Run("ACPI honoured", func(t *testing.T) {
		f := newUnit(t, nil)
		mustProvision(t, f, "i-1")
		m, err := f.p.Stop(ctx, "i-1")
		if err != nil || m.State != providers.StateStopped {
			t.Fatalf("stop = %+v, %v", m, err)
		}
		if got := f.lv.callsOf("Destroy"); len(got) != 0 {
			t.Fatalf("destroyed a guest that shut down: %v", got)
		}
	})
	t.Run("ACPI ignored: destroyed after the grace", func(t *testing.T) {
		f := newUnit(t, func(c *Config) { c.StopGrace = 3 * time.Second })
		mustProvision(t, f, "i-1")
		f.lv.ignoreACPI = true
		done := make(chan error, 1)
		go func() {
			_, err := f.p.Stop(ctx, "i-1")
			done <- err
		}()
		// The grace timer and the poll ticker.
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := f.clk.BlockUntil(wctx, 2); err != nil {
			t.Fatal(err)
		}
		if got := f.lv.callsOf("Destroy"); len(got) != 0 {
			t.Fatalf("destroyed before the grace: %v", got)
		}
		f.clk.Advance(3 * time.Second)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if got := f.lv.callsOf("Destroy"); len(got) != 1 {
			t.Fatalf("destroy calls = %v, want one", got)
		}
		if d := f.lv.domain("tether-i-1"); d.state != golibvirt.DomainShutoff {
			t.Fatalf("state = %d", d.state)
		}
	})
	t.Run("ACPI refused: destroyed at once", func(t *testing.T) {
		f := newUnit(t, nil)
		mustProvision(t, f, "i-1")
		f.lv.failNext("Shutdown", lverr(golibvirt.ErrOperationFailed, "no ACPI"))
		if m, err := f.p.Stop(ctx, "i-1"); err != nil || m.State != providers.StateStopped {
			t.Fatalf("stop = %+v, %v", m, err)
		}
	})
	t.Run("paused: the button is refused, the domain destroyed", func(t *testing.T) {
		f := newUnit(t, nil)
		mustProvision(t, f, "i-1")
		f.lv.setState("tether-i-1", golibvirt.DomainPaused, 0)
		if m, err := f.p.Stop(ctx, "i-1"); err != nil || m.State != providers.StateStopped {
			t.Fatalf("stop = %+v, %v", m, err)
		}
		if d := f.lv.domain("tether-i-1"); d.state != golibvirt.DomainShutoff {
			t.Fatalf("a paused domain was left in state %d", d.state)
		}
	})
	t.Run("destroy fails", func(t *testing.T) {
		f := newUnit(t, nil)
		mustProvision(t, f, "i-1")
		f.lv.failNext("Shutdown", lverr(golibvirt.ErrOperationFailed, "no ACPI"))
		f.lv.failNext("Destroy", lverr(golibvirt.ErrSystemError, "Failed to terminate process: Device or resource busy"))
		_, err := f.p.Stop(ctx, "i-1")
		if providers.KindOf(err) != providers.KindTransient || !strings.Contains(err.Error(), "resource busy") {
			t.Fatalf("stop = %v, want transient with libvirt's reason", err)
		}
	})
	t.Run("stopped already", func(t *testing.T) {
		f := newUnit(t, nil)
		mustProvision(t, f, "i-1")
		f.lv.setState("tether-i-1", golibvirt.DomainShutoff, int32(golibvirt.DomainShutoffShutdown))
		if m, err := f.p.Stop(ctx, "i-1"); err != nil || m.State != providers.StateStopped {
			t.Fatalf("stop = %+v, %v", m, err)
		}
		if got := f.lv.callsOf("Shutdown"); len(got) != 0 {
			t.Fatalf("shut down a stopped domain: %v", got)
		}
	})
	t.Run("missing", func(t *testing.T) {
		f := newUnit(t, nil)
		if _, err := f.p.Stop(ctx, "i-1"); !providers.IsNotFound(err) {
			t.Fatalf("stop = %v, want not found", err)
		}
	})
}

func TestStartAndReboot(t *testing.T) {
	f := newUnit(t, nil)
	mustProvision(t, f, "i-1")
	uuid := f.lv.domain("tether-i-1").uuid

	if m, err := f.p.Start(ctx, "i-1", f.boot("tok-two-"+strings.Repeat("2", 20))); err != nil || m.State != providers.StateRunning {
		t.Fatalf("start of a running domain = %+v, %v", m, err)
	}
	if n := len(f.lv.callsOf("Create")); n != 1 {
		t.Fatalf("start of a running domain booted it again (%d creates)", n)
	}
	f.lv.setState("tether-i-1", golibvirt.DomainShutoff, int32(golibvirt.DomainShutoffShutdown))
	tok2 := "tok-two-" + strings.Repeat("2", 20)
	if m, err := f.p.Start(ctx, "i-1", f.boot(tok2)); err != nil || m.State != providers.StateRunning {
		t.Fatalf("start = %+v, %v", m, err)
	}
	tok3 := "tok-three-" + strings.Repeat("3", 20)
	if m, err := f.p.Reboot(ctx, "i-1", f.boot(tok3)); err != nil || m.State != providers.StateRunning {
		t.Fatalf("reboot = %+v, %v", m, err)
	}
	if got := f.lv.callsOf("Destroy"); len(got) != 1 {
		t.Fatalf("reboot destroys = %v, want one", got)
	}
	if len(f.lv.tokens) != 3 || f.lv.tokens[1] != tok2 || f.lv.tokens[2] != tok3 {
		t.Fatalf("tokens read = %q", f.lv.tokens)
	}
	if got := f.lv.domain("tether-i-1").uuid; got != uuid {
		t.Fatalf("uuid changed: %s → %s", uuid, got)
	}
	for _, op := range []func() error{
		func() error { _, err := f.p.Start(ctx, "i-9", f.boot("t")); return err },
		func() error { _, err := f.p.Reboot(ctx, "i-9", f.boot("t")); return err },
	} {
		if err := op(); !providers.IsNotFound(err) {
			t.Fatalf("power on a missing domain = %v, want not found", err)
		}
	}
}

func TestTerminate(t *testing.T) {
	f := newUnit(t, nil)
	mustProvision(t, f, "i-1")
	if err := os.WriteFile(f.p.ConsoleLogPath("i-1"), []byte("console"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := f.p.Terminate(ctx, "i-1"); err != nil {
		t.Fatal(err)
	}
	if f.lv.domain("tether-i-1") != nil {
		t.Fatal("domain left")
	}
	want := fmt.Sprintf("Undefine(%d) tether-i-1", undefineFlags)
	if got := f.lv.callsOf("Undefine"); !slices.Equal(got, []string{want}) {
		t.Fatalf("undefine calls = %v, want %q (with NVRAM)", got, want)
	}
	if undefineFlags&golibvirt.DomainUndefineNvram == 0 {
		t.Fatal("terminate keeps the NVRAM")
	}
	if _, err := os.Stat(filepath.Join(f.p.cfg.StateDir, "i-1")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("instance dir left: %v", err)
	}
	if err := f.p.Terminate(ctx, "i-1"); err != nil {
		t.Fatalf("terminate of a gone domain = %v", err)
	}

	mustProvision(t, f, "i-2")
	f.lv.failNext(fmt.Sprintf("Undefine(%d)", undefineFlags), lverr(golibvirt.ErrOperationInvalid, "cannot undefine domain with nvram"))
	if err := f.p.Terminate(ctx, "i-2"); err == nil || !strings.Contains(err.Error(), "undefine") {
		t.Fatalf("terminate with a failing undefine = %v", err)
	}
	if f.lv.domain("tether-i-2") == nil {
		t.Fatal("domain gone though undefine failed")
	}
	if _, err := os.Stat(filepath.Join(f.p.cfg.StateDir, "i-2")); err != nil {
		t.Fatalf("instance dir removed though the domain remains: %v", err)
	}
}

func TestStatusAndList(t *testing.T) {
	f := newUnit(t, nil)
	if m, err := f.p.Status(ctx, "i-1"); err != nil || m.State != providers.StateGone {
		t.Fatalf("status of nothing = %+v, %v", m, err)
	}
	mustProvision(t, f, "i-1")
	mustProvision(t, f, "i-2")
	f.lv.plant("web-server", "", golibvirt.DomainRunning)
	f.lv.plant("tether-junk", `<tether:instance xmlns:tether="`+MetadataNS+`">../no</tether:instance>`, golibvirt.DomainRunning)
	f.lv.setState("tether-i-2", golibvirt.DomainPaused, 0)
	ms, err := f.p.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]providers.MachineState{}
	for _, m := range ms {
		got[m.InstanceID] = m.State
	}
	if len(got) != 2 || got["i-1"] != providers.StateRunning || got["i-2"] != providers.StatePaused {
		t.Fatalf("list = %+v", ms)
	}

	f.lv.failNext("ListAll", lverr(golibvirt.ErrRPC, "connection reset"))
	if _, err := f.p.List(ctx); providers.KindOf(err) != providers.KindTransient {
		t.Fatalf("list with a failing libvirtd = %v, want transient", err)
	}
}

func TestMachineState(t *testing.T) {
	cases := []struct {
		st   golibvirt.DomainState
		want providers.MachineState
	}{
		{golibvirt.DomainRunning, providers.StateRunning},
		{golibvirt.DomainBlocked, providers.StateRunning},
		{golibvirt.DomainShutdown, providers.StateRunning},
		{golibvirt.DomainPaused, providers.StatePaused},
		{golibvirt.DomainPmsuspended, providers.StatePaused},
		{golibvirt.DomainShutoff, providers.StateStopped},
		{golibvirt.DomainCrashed, providers.StateStopped},
		{golibvirt.DomainNostate, providers.StateUnknown},
		{golibvirt.DomainState(42), providers.StateUnknown},
	}
	for _, tc := range cases {
		if got := machineState(tc.st); got != tc.want {
			t.Errorf("machineState(%d) = %s, want %s", tc.st, got, tc.want)
		}
	}
}

func TestNetbootKeepsTheMAC(t *testing.T) {
	f := newUnit(t, func(c *Config) { c.Boot = BootNetwork; c.Firmware = FirmwareUEFI })
	if !f.p.Netboots() {
		t.Fatal("a network-boot provider says it does not netboot")
	}
	b := f.boot("")
	if _, err := f.p.Provision(ctx, providers.Spec{InstanceID: "i-1", Boot: b}); providers.KindOf(err) != providers.KindPermanent {
		t.Fatalf("netboot without a MAC = %v, want permanent", err)
	}
	const mac = "52:54:00:12:34:56"
	if _, err := f.p.Provision(ctx, providers.Spec{InstanceID: "i-1", Boot: b, MAC: mac}); err != nil {
		t.Fatal(err)
	}
	x := f.lv.domain("tether-i-1").xml
	for _, want := range []string{"bootfile=http://10.0.2.2:8080/ipxe/boot?mac=" + mac, "mac=" + mac, "OVMF_CODE.fd", "OVMF_VARS.fd"} {
		if !strings.Contains(x, want) {
			t.Errorf("definition lacks %q:\n%s", want, x)
		}
	}
	if strings.Contains(x, "<kernel>") || strings.Contains(x, "opt/tether/token") {
		t.Fatalf("a netbooting domain got a kernel or a token:\n%s", x)
	}
	f.lv.setState("tether-i-1", golibvirt.DomainShutoff, int32(golibvirt.DomainShutoffDestroyed))
	if _, err := f.p.Start(ctx, "i-1", b); err != nil {
		t.Fatal(err)
	}
	if x := f.lv.domain("tether-i-1").xml; !strings.Contains(x, "mac="+mac) {
		t.Fatalf("start lost the MAC:\n%s", x)
	}
	if len(f.lv.tokens) != 0 {
		t.Fatalf("a netbooting domain read tokens %q", f.lv.tokens)
	}
}

// UEFI HTTP Boot under Secure Boot: the firmware is pointed at the node's
// image, with no iPXE ROM, the secboot firmware and SMM.
func TestUEFIHTTPBootDefinition(t *testing.T) {
	f := newUnit(t, func(c *Config) { c.Boot, c.Firmware, c.SecureBoot = BootUEFIHTTP, FirmwareUEFI, true })
	if !f.p.Netboots() {
		t.Fatal("a uefi-http provider says it does not netboot")
	}
	const mac = "52:54:00:12:34:57"
	if _, err := f.p.Provision(ctx, providers.Spec{InstanceID: "i-1", Boot: f.boot(""), MAC: mac}); err != nil {
		t.Fatal(err)
	}
	x := f.lv.domain("tether-i-1").xml
	for _, want := range []string{"bootfile=http://10.0.2.2:8080/uki/boot?mac=" + mac, ",romfile=", "OVMF_CODE_4M.secboot.fd", "OVMF_VARS_4M.snakeoil.fd",
		`secure="yes"`, `<smm state="on">`, "IPv4PXESupport"} {
		if !strings.Contains(x, want) {
			t.Errorf("definition lacks %q:\n%s", want, x)
		}
	}
	if strings.Contains(x, "/ipxe/boot") || strings.Contains(x, "opt/tether/") {
		t.Fatalf("a uefi-http domain got the iPXE route or Tether fw_cfg entries:\n%s", x)
	}
}

func TestSessionEndsWithTheContext(t *testing.T) {
	f := newUnit(t, nil)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err := f.p.Status(cctx, "i-1")
	if providers.KindOf(err) != providers.KindTransient || !errors.Is(err, context.Canceled) {
		t.Fatalf("status with a cancelled context = %v, want transient wrapping context.Canceled", err)
	}
}

func mustProvision(t *testing.T, f *unitFixture, id string) {
	t.Helper()
	m, err := f.p.Provision(ctx, providers.Spec{InstanceID: id, Boot: f.boot("tok-" + id + "-" + strings.Repeat("z", 20))})
	if err != nil || m.State != providers.StateRunning {
		t.Fatalf("provision %s = %+v, %v", id, m, err)
	}
}

func TestStagesBootFilesForAnotherQEMUUser(t *testing.T) {
	owner := fmt.Sprintf("%d:%d", os.Getuid(), os.Getgid())
	f := newUnit(t, func(c *Config) { c.FileOwner = owner })
	mustProvision(t, f, "i-1")
	dir := filepath.Join(f.p.cfg.StateDir, "i-1")
	x := f.lv.domain("tether-i-1").xml
	for _, want := range []string{"<kernel>" + filepath.Join(dir, "kernel-vmlinuz") + "</kernel>", "<initrd>" + filepath.Join(dir, "initramfs-initrd") + "</initrd>"} {
		if !strings.Contains(x, want) {
			t.Fatalf("definition lacks %q:\n%s", want, x)
		}
	}
	// A new artifact replaces the old copy; the same one is not copied again.
	k2 := filepath.Join(f.dir, "vmlinuz-2")
	if err := os.WriteFile(k2, []byte("kernel two"), 0o600); err != nil {
		t.Fatal(err)
	}
	b := f.boot("tok-" + strings.Repeat("q", 20))
	b.KernelPath = k2
	if _, err := f.p.Reboot(ctx, "i-1", b); err != nil {
		t.Fatal(err)
	}
	got, _ := filepath.Glob(filepath.Join(dir, "kernel-*"))
	if !slices.Equal(got, []string{filepath.Join(dir, "kernel-vmlinuz-2")}) {
		t.Fatalf("staged kernels = %v", got)
	}
	if fi, err := os.Stat(filepath.Dir(dir)); err != nil || fi.Mode().Perm() != 0o711 {
		t.Fatalf("state dir mode = %v, %v; want 0711 so QEMU's user can pass", fi.Mode().Perm(), err)
	}
}

func TestBlockedParent(t *testing.T) {
	dir := t.TempDir()
	private := filepath.Join(dir, "private")
	open := filepath.Join(dir, "open")
	for p, mode := range map[string]os.FileMode{private: 0o700, open: 0o711} {
		if err := os.Mkdir(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const other = 54321
	if got := blockedParent(filepath.Join(private, "libvirt"), other); got != private {
		t.Errorf("blockedParent under a 0700 dir = %q, want %q", got, private)
	}
	if got := blockedParent(filepath.Join(private, "libvirt"), os.Getuid()); got != "" && got != private {
		t.Errorf("blockedParent for the owner = %q", got)
	}
	if got := blockedParent(filepath.Join(open, "libvirt"), other); got != "" && !strings.HasPrefix(dir, got) {
		t.Errorf("blockedParent under a 0711 dir = %q, want none below %s", got, dir)
	}
}

func TestDomainTypeFollowsLibvirtd(t *testing.T) {
	cases := []struct {
		name, configured, caps, want string
	}{
		{"auto, kvm offered", DomainTypeAuto, `<capabilities><guest><os_type>hvm</os_type><arch name='x86_64'><domain type='qemu'/><domain type='kvm'/></arch></guest></capabilities>`, `type="kvm"`},
		{"auto, TCG only", DomainTypeAuto, `<capabilities><guest><os_type>hvm</os_type><arch name='x86_64'><domain type='qemu'/></arch></guest></capabilities>`, `type="qemu"`},
		{"forced qemu", DomainTypeQEMU, `<capabilities><guest><os_type>hvm</os_type><arch name='x86_64'><domain type='kvm'/></arch></guest></capabilities>`, `type="qemu"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newUnit(t, func(c *Config) { c.DomainType = tc.configured })
			f.lv.caps = tc.caps
			mustProvision(t, f, "i-1")
			if x := f.lv.domain("tether-i-1").xml; !strings.Contains(x, `<domain `+tc.want) {
				t.Fatalf("definition does not start with <domain %s:\n%s", tc.want, x)
			}
		})
	}
	f := newUnit(t, nil)
	f.lv.failNext("Capabilities", lverr(golibvirt.ErrRPC, "connection reset"))
	if _, err := f.p.Provision(ctx, providers.Spec{InstanceID: "i-1", Boot: f.boot("t-" + strings.Repeat("k", 20))}); providers.KindOf(err) != providers.KindTransient || !strings.Contains(err.Error(), "capabilities") {
		t.Fatalf("provision when the capabilities fail = %v, want transient naming them", err)
	}
}

// A tokenless boot on a TPM domain: the instance id in fw_cfg, no token
// entry and no token file, and the TPM element from Config.TPM.
func TestProvisionTokenlessWithTPM(t *testing.T) {
	for _, tpm := range []bool{false, true} {
		t.Run(fmt.Sprintf("tpm=%v", tpm), func(t *testing.T) {
			f := newUnit(t, func(c *Config) { c.TPM = tpm })
			b := f.boot("")
			b.Enrollment.InstanceID = "i-1"
			if _, err := f.p.Provision(ctx, providers.Spec{InstanceID: "i-1", Boot: b}); err != nil {
				t.Fatal(err)
			}
			x := f.lv.domain("tether-i-1").xml
			if !strings.Contains(x, `<entry name="opt/tether/instance">i-1</entry>`) || strings.Contains(x, "opt/tether/token") {
				t.Fatalf("definition of a tokenless boot:\n%s", x)
			}
			if len(f.lv.tokens) != 0 {
				t.Fatalf("QEMU read tokens %q", f.lv.tokens)
			}
			if got := strings.Contains(x, `<tpm model="tpm-crb">`); got != tpm {
				t.Fatalf("tpm-crb in the definition: %v, want %v:\n%s", got, tpm, x)
			}
		})
	}
}
