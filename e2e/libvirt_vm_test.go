package e2e

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
	"github.com/tetherfleet/tether/providers/libvirt"
	"github.com/tetherfleet/tether/providers/libvirt/libvirttest"
)

// Real-VM tests of the libvirt provider: tetherd drives a private libvirtd
// (libvirttest: a session daemon in a temporary directory, QEMU under TCG,
// user-mode networking), and the real initramfs boots to running.

// newLibvirtEnv is a control plane with the libvirt provider on a private
// libvirtd, booting the way boot says (direct or network).
func newLibvirtEnv(t *testing.T, boot, mac string) (*vmEnv, *libvirttest.Daemon) {
	t.Helper()
	requireVM(t)
	if boot == "network" {
		requireFiles(t, map[string]string{ipxeROM: "ipxe-qemu"})
	}
	d := libvirttest.Start(t)
	env := newVMEnv(t, testcp.With(func(o *daemon.ServeOptions) {
		o.Providers.Libvirt = daemon.LibvirtOptions{URI: d.URI, StateDir: d.StateDir, FileOwner: d.Owner, Boot: boot, StopGrace: time.Second}
		if boot == "network" && o.Listeners.Netboot == "" {
			o.Listeners.Netboot = "127.0.0.1:0"
		}
	}))
	if mac != "" {
		if _, err := env.cp.Admin.UpdateNode(context.Background(), &v1.UpdateNodeRequest{Name: env.node, UpdateMask: []string{"macs"}, Macs: []string{mac}}); err != nil {
			t.Fatalf("give the node its MAC: %v", err)
		}
	}
	terminateLibvirtOnCleanup(t, env)
	return env, d
}

// terminateLibvirtOnCleanup terminates env's libvirt instances when the
// test ends, before the daemon's own cleanup stops libvirtd: every domain
// goes through the provider's terminate first.
func terminateLibvirtOnCleanup(t *testing.T, env *vmEnv) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		list, err := env.cp.Admin.ListInstances(ctx, &v1.ListInstancesRequest{PageSize: 1000})
		if err != nil {
			t.Errorf("cleanup: list instances: %v", err)
			return
		}
		for _, in := range list.Instances {
			if in.Status != v1.InstanceStatus_INSTANCE_STATUS_TERMINATED && in.Provider == libvirt.Name {
				if _, err := env.cp.Admin.TerminateInstance(ctx, &v1.InstanceActionRequest{Id: in.Id}); err != nil {
					t.Errorf("cleanup: terminate %s: %v", in.Id, err)
				}
			}
		}
	})
}

func (e *vmEnv) provisionOn(t *testing.T, ctx context.Context, provider string) string {
	t.Helper()
	resp, err := e.cp.Admin.ProvisionInstance(ctx, &v1.ProvisionInstanceRequest{Node: e.node, Provider: provider})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Instance.Id
}

// TestLibvirtVMBoot: direct boot through libvirtd to running, a stop and a
// start with a fresh enrollment, then a terminate that leaves no domain.
func TestLibvirtVMBoot(t *testing.T) {
	env, d := newLibvirtEnv(t, "direct", "")
	ctx := vmCtx(t)
	start := time.Now()
	id := env.provisionOn(t, ctx, libvirt.Name)
	env.waitRunning(t, ctx, id, nil)
	t.Logf("provision -> running through libvirt in %s", time.Since(start).Round(10*time.Millisecond))
	console := env.console(ctx, id)
	for _, want := range []string{"phase enrolling", "phase ready", "TETHER_EXAMPLE_READY"} {
		if !strings.Contains(console, want) {
			t.Errorf("console lacks %q", want)
		}
	}
	if names := d.DomainNames(t); len(names) != 1 || names[0] != libvirt.DomainName(id) {
		t.Fatalf("domains = %v, want the instance's", names)
	}
	before := bootID(t, env, ctx, id)
	certsBefore := len(env.certs(t, ctx, id))

	if _, err := env.cp.Admin.StopInstance(ctx, &v1.InstanceActionRequest{Id: id}); err != nil {
		t.Fatal(err)
	}
	if in, err := env.cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: id}); err != nil || in.Status != v1.InstanceStatus_INSTANCE_STATUS_STOPPED {
		t.Fatalf("after stop: %v, %v", in.GetStatus(), err)
	}
	if _, err := env.cp.Admin.StartInstance(ctx, &v1.InstanceActionRequest{Id: id}); err != nil {
		t.Fatal(err)
	}
	env.waitRunning(t, ctx, id, nil)
	if after := bootID(t, env, ctx, id); after == before {
		t.Fatalf("the start did not boot the machine again: boot id %s unchanged", after)
	}
	if n := len(env.certs(t, ctx, id)); n <= certsBefore {
		t.Fatalf("a new boot must enroll again: %d certificates, had %d", n, certsBefore)
	}

	if _, err := env.cp.Admin.TerminateInstance(ctx, &v1.InstanceActionRequest{Id: id}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		in, err := env.cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: id})
		if err == nil && in.Status == v1.InstanceStatus_INSTANCE_STATUS_TERMINATED {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not terminated within a minute: %v %v", in.GetStatus(), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if names := d.DomainNames(t); len(names) != 0 {
		t.Fatalf("domains after terminate = %v", names)
	}
}

// TestLibvirtVMNetbootUserNet: the domain's SeaBIOS and NIC iPXE ROM,
// QEMU's user-mode DHCP pointing it at tetherd's /ipxe/boot?mac= route,
// everything fetched over HTTP, to running.
func TestLibvirtVMNetbootUserNet(t *testing.T) {
	const mac = "52:54:00:1b:7e:01"
	env, _ := newLibvirtEnv(t, "network", mac)
	ctx := vmCtx(t)
	id := env.provisionOn(t, ctx, libvirt.Name)
	env.waitRunning(t, ctx, id, nil)
	checkNetbootConsole(t, env.console(ctx, id), mac)
}

// TestLibvirtVMUKIHTTPBoot: a libvirt domain with Secure Boot OVMF
// (<loader secure='yes'>, SMM, the snakeoil NVRAM) boots its node's
// signed image over its own UEFI HTTP Boot, with no iPXE, to running.
func TestLibvirtVMUKIHTTPBoot(t *testing.T) {
	u := prepareUKI(t, "127.0.0.1")
	_, nbPort, _ := net.SplitHostPort(u.netLis.Addr().String())
	signed := u.build(t, "signed.efi", u.a.initramfs, nbPort, true)
	d := libvirttest.Start(t)
	env := newVMEnv(t, testcp.WithDataDir(u.data), testcp.With(func(o *daemon.ServeOptions) {
		o.Listeners.GRPC, o.Test.NetbootListener = u.apiAddr, u.netLis
		o.Providers.Libvirt = daemon.LibvirtOptions{URI: d.URI, StateDir: d.StateDir, FileOwner: d.Owner, Boot: "uefi-http", Firmware: "uefi",
			SecureBoot: true, StopGrace: time.Second}
		o.UKIs = []string{strings.ToLower(t.Name()) + "=" + signed}
	}))
	terminateLibvirtOnCleanup(t, env)
	ctx := vmCtx(t)
	id := env.provisionOn(t, ctx, libvirt.Name)
	env.waitRunning(t, ctx, id, nil)
	console := env.console(ctx, id)
	for _, want := range []string{"Start HTTP Boot over IPv4", "/uki/boot?mac=", "secureboot: Secure boot enabled", "from netboot hand-off"} {
		if !strings.Contains(console, want) {
			t.Errorf("console lacks %q:\n%s", want, tail(console, 4000))
		}
	}
	if strings.Contains(console, "iPXE") {
		t.Errorf("an iPXE ran:\n%s", tail(console, 4000))
	}
}
