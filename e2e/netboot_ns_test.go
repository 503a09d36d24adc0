package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/controlplane/netboot/pxe"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/qemu"
)

// The namespace tests boot VMs that talk to tetherd's own DHCP, TFTP and
// HTTP on a bridge. Everything happens in a network namespace the test
// creates and always removes: the test binary re-executes itself inside
// it (`ip netns exec`), so tetherd's listeners, dnsmasq and the VM's tap
// exist only there. The bridge has 10.0.2.2/24, the address tetherd's
// certificates and default URLs already name for QEMU guests.

const (
	nsChildEnv = "TETHER_E2E_NETNS_CHILD"
	nsBridge   = "br0"
	nsTap      = "tap0"
	nsServerIP = "10.0.2.2"
	nsRange    = "10.0.2.100-10.0.2.150"
	ipxeDir    = "/usr/lib/ipxe"
)

// TestVMNetbootNamespace: BIOS PXE in full mode to running and an exec;
// replay of the boot script (410, high event) and a reboot that enrolls
// again; an unknown MAC refused on the console; UEFI PXE; proxyDHCP
// beside dnsmasq. One namespace and, per DHCP mode, one tetherd.
func TestVMNetbootNamespace(t *testing.T) {
	if os.Getenv(nsChildEnv) != "" {
		netbootNamespaceChild(t)
		return
	}
	requireVM(t)
	requireFiles(t, map[string]string{ipxeROM: "ipxe-qemu", filepath.Join(ipxeDir, "undionly.kpxe"): "ipxe", filepath.Join(ipxeDir, "ipxe.efi"): "ipxe"})
	skip := func(format string, args ...any) {
		msg := "SKIP (real-VM e2e, network namespace): " + fmt.Sprintf(format, args...)
		fmt.Fprintln(os.Stderr, msg)
		t.Skip(msg)
	}
	if os.Geteuid() != 0 {
		skip("needs root to create a network namespace, a bridge and a tap")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		skip("iproute2's ip is not installed (apt-get install iproute2)")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		skip("/dev/net/tun is missing: no tap devices here")
	}
	ns := fmt.Sprintf("tether-e2e-%d", os.Getpid())
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	ip("netns", "add", ns)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			t.Errorf("remove network namespace %s: %v\n%s", ns, err, out)
		}
	})
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", nsBridge, "type", "bridge"},
		{"addr", "add", nsServerIP + "/24", "dev", nsBridge},
		{"-6", "addr", "add", "fd00:2::2/64", "dev", nsBridge},
		{"link", "set", nsBridge, "up"},
		{"tuntap", "add", nsTap, "mode", "tap"},
		{"link", "set", nsTap, "master", nsBridge},
		{"link", "set", nsTap, "up"},
	} {
		ip(append([]string{"-n", ns}, args...)...)
	}
	// TETHER_E2E_NETNS_RUN narrows the subtests run in the namespace
	// ("^uefi-http$"), for working on one.
	run := "^TestVMNetbootNamespace$"
	if sub := os.Getenv("TETHER_E2E_NETNS_RUN"); sub != "" {
		run += "/" + sub
	}
	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run="+run, "-test.v", "-test.count=1", "-test.timeout=14m")
	cmd.Env = append(os.Environ(), nsChildEnv+"=1")
	var out bytes.Buffer
	cmd.Stdout = io.MultiWriter(&out, os.Stdout)
	cmd.Stderr = cmd.Stdout
	if err := cmd.Run(); err != nil {
		t.Fatalf("the tests inside namespace %s failed: %v", ns, err)
	}
	if !strings.Contains(out.String(), "--- PASS: TestVMNetbootNamespace") {
		t.Fatalf("the child did not run the tests")
	}
}

// nsEnv is a tetherd serving DHCP in the namespace, with its qemu VMs on
// the tap.
func newNSEnv(t *testing.T, boot, dhcpMode string) (*vmEnv, string) {
	t.Helper()
	netLis, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(netLis.Addr().String())
	env := newVMEnv(t, testcp.With(func(o *daemon.ServeOptions) {
		o.Listeners.GRPC = "0.0.0.0:0"
		o.Providers.QEMU.Boot, o.Providers.QEMU.Tap = boot, nsTap
		o.Test.NetbootListener = netLis
		o.Listeners.PXE = pxe.Options{Interface: nsBridge, Mode: dhcpMode, IPXEDir: ipxeDir}
		if dhcpMode == "full" {
			o.Listeners.PXE.Range, o.Listeners.PXE.Router = nsRange, nsServerIP
		}
	}))
	return env, "http://" + net.JoinHostPort(nsServerIP, port)
}

func (e *vmEnv) setMAC(t *testing.T, mac string) {
	t.Helper()
	if _, err := e.cp.Admin.UpdateNode(context.Background(), &v1.UpdateNodeRequest{Name: e.node, UpdateMask: []string{"macs"}, Macs: []string{mac}}); err != nil {
		t.Fatalf("give the node its MAC: %v", err)
	}
}

func (e *vmEnv) events(t *testing.T, ctx context.Context, kind, instance string) []*v1.FleetEvent {
	t.Helper()
	resp, err := e.cp.Admin.ListEvents(ctx, &v1.ListEventsRequest{Kind: kind, InstanceId: instance, PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Events
}

func netbootNamespaceChild(t *testing.T) {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Fatal("qemu vanished inside the namespace")
	}
	t.Run("full", func(t *testing.T) {
		env, netbootURL := newNSEnv(t, "bios", "full")
		const mac = "52:54:00:0e:2e:10"
		env.setMAC(t, mac)
		ctx := vmCtx(t)

		// BIOS PXE: DHCP and TFTP (undionly.kpxe) from tetherd, then iPXE's
		// DHCP gets the boot route, and the agent's DHCP its address.
		start := time.Now()
		id := env.provision(t, ctx)
		env.waitRunning(t, ctx, id, nil)
		console := env.console(ctx, id)
		logBootTime(t, "full DHCP", start, console)
		checkNetbootConsole(t, console, mac)
		// QEMU's NIC ROM is iPXE already: tetherd's DHCP hands it the boot
		// route at once (no undionly.kpxe over TFTP), and the agent's
		// address comes from tetherd's range.
		if !strings.Contains(console, "): 10.0.2.1") {
			t.Errorf("the agent's address is not from tetherd's range %s:\n%s", nsRange, tail(console, 4000))
		}
		if out := env.exec(t, ctx, id, "cat", "/etc/os-release"); !strings.Contains(out, "ID=tether-example") {
			t.Fatalf("os-release from the module:\n%s", out)
		}

		// Replay: in the reboot's boot window, fetch the script again once
		// the machine has had it.
		served := len(env.events(t, ctx, "netboot.script_served", id))
		certs := len(env.certs(t, ctx, id))
		if _, err := env.cp.Admin.RebootInstance(ctx, &v1.InstanceActionRequest{Id: id}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(bootTimeout)
		for len(env.events(t, ctx, "netboot.script_served", id)) == served {
			if time.Now().After(deadline) {
				t.Fatalf("the rebooted machine never fetched its script:\n%s", tail(env.console(ctx, id), 3000))
			}
			time.Sleep(50 * time.Millisecond)
		}
		resp, err := http.Get(netbootURL + "/ipxe/boot?mac=" + mac)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusGone || strings.Contains(string(body), "tether.token=") {
			t.Fatalf("a second fetch in one boot: %d %q, want 410 and no token", resp.StatusCode, body)
		}
		high := false
		for _, ev := range env.events(t, ctx, "netboot.script_refused", id) {
			high = high || ev.Severity == v1.Severity_SEVERITY_HIGH
		}
		if !high {
			t.Errorf("no high-severity netboot.script_refused event for the replay: %v", env.events(t, ctx, "netboot.script_refused", id))
		}
		env.waitRunning(t, ctx, id, func(*v1.Instance) bool { return len(env.certs(t, ctx, id)) > certs })
		if _, err := env.cp.Admin.TerminateInstance(ctx, &v1.InstanceActionRequest{Id: id}); err != nil {
			t.Fatal(err)
		}

		// Unknown MAC: a VM no node owns gets a refusal script; its
		// console says why, an event names the MAC, no token is issued.
		tokens := len(env.events(t, ctx, "token.issued", ""))
		const stranger = "52:54:00:0e:2e:99"
		stateDir, err := os.MkdirTemp("", "tq")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(stateDir)
		p, err := qemu.New(qemu.Config{Mode: qemu.ModeReal, StateDir: stateDir, Boot: qemu.BootBIOS, Tap: nsTap})
		if err != nil {
			t.Fatal(err)
		}
		const vm = "unknown-mac-vm"
		if _, err := p.Provision(ctx, providers.Spec{InstanceID: vm, MAC: stranger}); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := p.Terminate(context.Background(), vm); err != nil {
				t.Errorf("terminate the unknown VM: %v", err)
			}
		}()
		deadline = time.Now().Add(bootTimeout)
		for {
			b, _ := os.ReadFile(p.ConsoleLogPath(vm))
			if strings.Contains(string(b), "Tether netboot refused") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no refusal on the unknown machine's console:\n%s", tail(string(b), 3000))
			}
			time.Sleep(250 * time.Millisecond)
		}
		named := false
		for _, ev := range env.events(t, ctx, "netboot.refused", "") {
			named = named || ev.Payload.GetFields()["mac"].GetStringValue() == stranger
		}
		if !named {
			t.Errorf("no netboot.refused event names %s", stranger)
		}
		if n := len(env.events(t, ctx, "token.issued", "")); n != tokens {
			t.Errorf("%d tokens issued for an unknown machine", n-tokens)
		}
	})

	t.Run("uefi", func(t *testing.T) {
		requireFiles(t, map[string]string{ovmfCode: "ovmf", ovmfVars: "ovmf"})
		env, _ := newNSEnv(t, "uefi", "full")
		const mac = "52:54:00:0e:2e:11"
		env.setMAC(t, mac)
		ctx := vmCtx(t)
		id := env.provision(t, ctx)
		env.waitRunning(t, ctx, id, nil)
		checkNetbootConsole(t, env.console(ctx, id), mac)
	})

	// UEFI HTTP Boot with no iPXE: tetherd's DHCP answers OVMF's
	// HTTPClient with the URL of its node's signed image, which boots
	// under Secure Boot and takes the agent's address from the range.
	t.Run("uefi-http", func(t *testing.T) {
		u := prepareUKI(t, "0.0.0.0")
		_, nbPort, _ := net.SplitHostPort(u.netLis.Addr().String())
		signed := u.build(t, "signed.efi", u.a.initramfs, nbPort, true)
		template := strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
		env := newVMEnv(t, testcp.WithDataDir(u.data), testcp.With(func(o *daemon.ServeOptions) {
			o.Listeners.GRPC, o.Test.NetbootListener = u.apiAddr, u.netLis
			o.Providers.QEMU.Boot, o.Providers.QEMU.Tap, o.Providers.QEMU.SecureBoot = "uefi-http", nsTap, true
			o.Listeners.PXE = pxe.Options{Interface: nsBridge, Mode: "full", IPXEDir: ipxeDir, Range: nsRange, Router: nsServerIP}
			o.UKIs = []string{template + "=" + signed}
		}))
		const mac = "52:54:00:0e:2e:13"
		env.setMAC(t, mac)
		ctx := vmCtx(t)
		id := env.provision(t, ctx)
		env.waitRunning(t, ctx, id, nil)
		console := env.console(ctx, id)
		for _, want := range []string{"Start HTTP Boot over IPv4", "URI: http://" + nsServerIP + ":" + nbPort + "/uki/boot?mac=" + mac,
			"secureboot: Secure boot enabled", "boot: network up: DHCP on", "): 10.0.2.1", "from netboot hand-off"} {
			if !strings.Contains(console, want) {
				t.Errorf("console lacks %q:\n%s", want, tail(console, 4000))
			}
		}
		if strings.Contains(console, "iPXE") {
			t.Errorf("an iPXE ran:\n%s", tail(console, 4000))
		}
		if evs := env.events(t, ctx, "netboot.uki_served", id); len(evs) != 1 {
			t.Errorf("%d netboot.uki_served events, want 1", len(evs))
		}
	})

	t.Run("proxy", func(t *testing.T) {
		dnsmasq, err := exec.LookPath("dnsmasq")
		if err != nil {
			msg := "SKIP (real-VM e2e, proxyDHCP): dnsmasq is not installed (apt-get install dnsmasq-base)"
			fmt.Fprintln(os.Stderr, msg)
			t.Skip(msg)
		}
		// The site's DHCP server: addresses only, no boot options, no DNS;
		// router advertisements so iPXE does not wait for IPv6.
		first, last, _ := strings.Cut(nsRange, "-")
		d := exec.Command(dnsmasq, "--no-daemon", "--port=0", "--interface="+nsBridge, "--bind-interfaces",
			"--dhcp-range="+first+","+last+",255.255.255.0,1h", "--dhcp-option=3,"+nsServerIP,
			"--enable-ra", "--dhcp-range=fd00:2::,ra-only", "--no-resolv", "--no-hosts", "--leasefile-ro", "--conf-file=/dev/null")
		var dlog bytes.Buffer
		d.Stdout, d.Stderr = &dlog, &dlog
		if err := d.Start(); err != nil {
			t.Fatalf("start dnsmasq: %v", err)
		}
		t.Cleanup(func() {
			_ = d.Process.Kill()
			_ = d.Wait()
		})
		env, _ := newNSEnv(t, "bios", "proxy")
		const mac = "52:54:00:0e:2e:12"
		env.setMAC(t, mac)
		ctx := vmCtx(t)
		start := time.Now()
		id := env.provision(t, ctx)
		env.waitRunning(t, ctx, id, nil)
		console := env.console(ctx, id)
		logBootTime(t, "proxyDHCP", start, console)
		checkNetbootConsole(t, console, mac)
		if t.Failed() {
			t.Logf("dnsmasq:\n%s", dlog.String())
		}
	})
}

// logBootTime records how long a namespace boot took to running and what
// its iPXE said while it configured the network (issue 30 compares the
// DHCP modes: a wait for a proxy offer or an IPv6 router would show here).
func logBootTime(t *testing.T, mode string, start time.Time, console string) {
	t.Helper()
	var net []string
	for _, l := range strings.Split(console, "\n") {
		l = strings.TrimSpace(strings.ReplaceAll(l, "\r", ""))
		if strings.HasPrefix(l, "Configuring (") || strings.HasPrefix(l, "net0:") || strings.HasPrefix(l, "Filename:") || strings.Contains(l, "DHCP took") {
			net = append(net, l)
		}
	}
	t.Logf("%s: provision to running in %s; network lines:\n%s", mode, time.Since(start).Round(10*time.Millisecond), strings.Join(net, "\n"))
}
