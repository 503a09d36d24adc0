package e2e

import (
	"context"
	"encoding/pem"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	"github.com/tetherfleet/tether/internal/uki"
	"github.com/tetherfleet/tether/pki"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
	"github.com/tetherfleet/tether/providers/qemu/qemutest"
)

// TestUKIHTTPBootUnderSecureBoot: tetherd serves each template's UKI
// (--uki) and qemu boots OVMF with Secure Boot over its own UEFI HTTP
// Boot (--qemu-boot uefi-http --qemu-secure-boot: no iPXE, no -kernel).
// The image signed with the firmware's db key boots, fetches its per-boot
// hand-off and reaches running; the same image unsigned is refused by the
// firmware, which says so on the console, and that node never enrolls.
func TestUKIHTTPBootUnderSecureBoot(t *testing.T) {
	u := prepareUKI(t, "127.0.0.1")
	_, nbPort, _ := net.SplitHostPort(u.netLis.Addr().String())
	unsigned := u.build(t, "unsigned.efi", u.a.initramfs, nbPort, false)
	signed := u.build(t, "signed.efi", u.a.initramfs, nbPort, true)
	ctx := context.Background()
	apiAddr, netLis, data := u.apiAddr, u.netLis, u.data

	// newRootEnv names the template after the test.
	good := strings.ToLower(t.Name())
	const bad, badNode = "unsigned-uki", "unsigned-uki-node"
	env := newVMEnv(t, testcp.WithDataDir(data), testcp.With(func(o *daemon.ServeOptions) {
		o.Listeners.GRPC = apiAddr
		o.Test.NetbootListener = netLis
		o.Providers.QEMU.Boot, o.Providers.QEMU.SecureBoot = "uefi-http", true
		o.UKIs = []string{good + "=" + signed, bad + "=" + unsigned}
	}))
	if _, err := env.cp.Admin.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: bad, RootModules: []*v1.ModuleRef{{Name: "example", Version: "1"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.cp.Admin.CreateNode(ctx, &v1.CreateNodeRequest{Name: badNode, Template: bad}); err != nil {
		t.Fatal(err)
	}
	vctx := vmCtx(t)
	id := env.provision(t, vctx)
	refused, err := env.cp.Admin.ProvisionInstance(vctx, &v1.ProvisionInstanceRequest{Node: badNode, Provider: "qemu"})
	if err != nil {
		t.Fatal(err)
	}

	env.waitRunning(t, vctx, id, nil)
	console := env.console(vctx, id)
	for _, want := range []string{"UEFI HTTPv4", "secureboot: Secure boot enabled", "from netboot hand-off"} {
		if !strings.Contains(console, want) {
			t.Errorf("the signed node's console lacks %q:\n%s", want, tail(console, 4000))
		}
	}
	for _, never := range []string{"iPXE", "PXE over IPv4"} {
		if strings.Contains(console, never) {
			t.Errorf("the signed node's console shows %q: the boot went through PXE or iPXE:\n%s", never, tail(console, 4000))
		}
	}
	if evs := env.events(t, vctx, "netboot.uki_served", id); len(evs) != 1 {
		t.Errorf("%d netboot.uki_served events for the signed node, want 1", len(evs))
	}

	// The unsigned image: the firmware refuses it, so no kernel starts and
	// the node never enrolls.
	deadline := time.Now().Add(bootTimeout)
	for !strings.Contains(env.console(vctx, refused.Instance.Id), "Access Denied") {
		if time.Now().After(deadline) {
			t.Fatalf("the firmware did not refuse the unsigned image:\n%s", tail(env.console(vctx, refused.Instance.Id), 4000))
		}
		time.Sleep(250 * time.Millisecond)
	}
	badConsole := env.console(vctx, refused.Instance.Id)
	if strings.Contains(badConsole, "Linux version") {
		t.Errorf("the unsigned image started a kernel:\n%s", tail(badConsole, 4000))
	}
	if evs := env.events(t, vctx, "netboot.uki_served", refused.Instance.Id); len(evs) == 0 {
		t.Errorf("the unsigned image was never downloaded: the refusal is not the firmware's")
	}
	if certs := env.certs(t, vctx, refused.Instance.Id); len(certs) != 0 {
		t.Errorf("the node that booted an unsigned image enrolled: %d certificates", len(certs))
	}
	if in, err := env.cp.Admin.GetInstance(vctx, &v1.GetInstanceRequest{Id: refused.Instance.Id}); err != nil || in.Status == v1.InstanceStatus_INSTANCE_STATUS_RUNNING {
		t.Errorf("the refused node: %v %v", in.GetStatus(), err)
	}
	t.Logf("refused on the console:\n%s", qemutest.Lines(writeTemp(t, badConsole), "Access Denied"))
}

// writeTemp puts s in a file, for qemutest's file-based helpers.
func writeTemp(t *testing.T, s string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "console.log")
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// ukiSetup is a control plane's data dir and ports, chosen before it
// starts: the image pins its URL and CA.
type ukiSetup struct {
	a             artifacts
	tools         uki.Tools
	dir, data     string
	apiAddr, caFP string
	netLis        net.Listener
	dbKey         string
}

// prepareUKI skips loudly without the firmware, the stub, sbsigntool or
// openssl, and lays out the data dir and the ports (on host, where the
// machines reach it: loopback for QEMU's user network).
func prepareUKI(t testing.TB, host string) *ukiSetup {
	t.Helper()
	u := &ukiSetup{a: requireVM(t)}
	requireFiles(t, map[string]string{secbootCode: "ovmf", snakeoilVars: "ovmf", snakeoilKey: "ovmf", snakeoilCert: "ovmf", uki.DefaultStub: "systemd-boot-efi"})
	if _, err := exec.LookPath("openssl"); err != nil {
		qemutest.SkipLoudly(t, "openssl is missing (it decrypts Debian's snakeoil key)")
	}
	var err error
	if u.tools, err = uki.FindTools(true); err != nil {
		qemutest.SkipLoudly(t, "%v", err)
	}
	u.dir = t.TempDir()
	u.data = filepath.Join(u.dir, "data")
	if err := daemon.Init(daemon.InitOptions{DataDir: u.data}); err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(u.data, daemon.AdminDir, daemon.AdminCAFile))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(caPEM)
	if block == nil {
		t.Fatal("no CA certificate in the data dir")
	}
	u.caFP = pki.Fingerprint(block.Bytes)
	free, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	u.apiAddr = free.Addr().String()
	free.Close()
	if u.netLis, err = net.Listen("tcp", net.JoinHostPort(host, "0")); err != nil {
		t.Fatal(err)
	}
	u.dbKey = filepath.Join(u.dir, "db.key")
	if out, err := exec.Command("openssl", "pkey", "-in", snakeoilKey, "-passin", "pass:snakeoil", "-out", u.dbKey).CombinedOutput(); err != nil {
		t.Fatalf("decrypt the snakeoil key: %v: %s", err, out)
	}
	return u
}

// build makes an image of initramfs whose agent fetches its hand-off at
// 10.0.2.2:handoffPort, signed with the snakeoil db key if sign.
func (u *ukiSetup) build(t testing.TB, name, initramfs, handoffPort string, sign bool) string {
	t.Helper()
	return u.buildWith(t, name, initramfs, handoffPort, sign, "")
}

// buildWith is build with the initramfs stored as compress says.
func (u *ukiSetup) buildWith(t testing.TB, name, initramfs, handoffPort string, sign bool, compress uki.Compression) string {
	t.Helper()
	_, apiPort, _ := net.SplitHostPort(u.apiAddr)
	spec := uki.Spec{Kernel: u.a.kernel, Initramfs: initramfs, Compress: compress,
		Cmdline: "console=ttyS0,115200 panic=-1 tether.url=https://10.0.2.2:" + apiPort + " tether.ca=" + u.caFP +
			" tether.handoff=http://10.0.2.2:" + handoffPort + " ip=dhcp"}
	out := filepath.Join(u.dir, name)
	unsigned := out
	if sign {
		unsigned = out + ".unsigned"
	}
	if err := uki.Build(context.Background(), u.tools, spec, unsigned); err != nil {
		t.Fatal(err)
	}
	if sign {
		if err := uki.Sign(context.Background(), u.tools, uki.Signer{Key: u.dbKey, Cert: snakeoilCert}, unsigned, out); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestUKIChainedFromIPXE: a machine whose firmware runs iPXE (OVMF with
// the NIC's iPXE ROM, --qemu-boot uefi, no Secure Boot) asks the iPXE boot
// route, is chained to its template's UKI, and reaches running from the
// image's own command line and the per-boot hand-off. Before the chain
// script passed that command line, iPXE's load options replaced it and
// the kernel started with no console and no control plane.
func TestUKIChainedFromIPXE(t *testing.T) {
	u := prepareUKI(t, "127.0.0.1")
	_, nbPort, _ := net.SplitHostPort(u.netLis.Addr().String())
	image := u.build(t, "chained.efi", u.a.initramfs, nbPort, true)
	apiAddr, netLis, data := u.apiAddr, u.netLis, u.data
	good := strings.ToLower(t.Name())
	env := newVMEnv(t, testcp.WithDataDir(data), testcp.With(func(o *daemon.ServeOptions) {
		o.Listeners.GRPC = apiAddr
		o.Test.NetbootListener = netLis
		o.Providers.QEMU.Boot = "uefi"
		o.UKIs = []string{good + "=" + image}
	}))
	vctx := vmCtx(t)
	id := env.provision(t, vctx)
	env.waitRunning(t, vctx, id, nil)
	console := env.console(vctx, id)
	// iPXE prints the URL without its query; the kernel's command line is
	// the image's, after the image name iPXE puts first.
	for _, want := range []string{"iPXE", "/uki/boot...", "Command line: boot console=ttyS0", "from netboot hand-off"} {
		if !strings.Contains(console, want) {
			t.Errorf("the chained node's console lacks %q:\n%s", want, console[:min(len(console), 6000)])
		}
	}
	if evs := env.events(t, vctx, "netboot.uki_served", id); len(evs) != 1 {
		t.Errorf("%d netboot.uki_served events, want 1", len(evs))
	}
}
