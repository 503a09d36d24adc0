package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// Firmware netboot tests: the VM gets no kernel, no initramfs and no
// token; its NIC's iPXE (under SeaBIOS or OVMF) fetches everything from
// tetherd, bound to the node by its hardware address.

const (
	ipxeROM  = "/usr/lib/ipxe/qemu/efi-virtio.rom"
	ovmfCode = "/usr/share/OVMF/OVMF_CODE.fd"
	ovmfVars = "/usr/share/OVMF/OVMF_VARS.fd"
)

// requireFiles skips loudly, naming the package, when a file is missing.
func requireFiles(t testing.TB, files map[string]string) {
	t.Helper()
	for path, pkg := range files {
		if _, err := os.Stat(path); err != nil {
			msg := fmt.Sprintf("SKIP (real-VM e2e): %s is missing (apt-get install %s)", path, pkg)
			fmt.Fprintln(os.Stderr, msg)
			t.Skip(msg)
		}
	}
}

// newNetbootEnv is a control plane whose qemu VMs netboot (boot is bios
// or uefi) over QEMU's user-mode network, and a node with a known MAC.
func newNetbootEnv(t *testing.T, boot, mac string, extra ...testcp.Option) *vmEnv {
	t.Helper()
	requireVM(t)
	files := map[string]string{ipxeROM: "ipxe-qemu"}
	if boot == "uefi" {
		files[ovmfCode], files[ovmfVars] = "ovmf", "ovmf"
	}
	requireFiles(t, files)
	opts := append([]testcp.Option{testcp.With(func(o *daemon.ServeOptions) {
		o.Providers.QEMU.Boot = boot
		if o.Listeners.Netboot == "" {
			o.Listeners.Netboot = "127.0.0.1:0"
		}
	})}, extra...)
	env := newVMEnv(t, opts...)
	if mac != "" {
		if _, err := env.cp.Admin.UpdateNode(context.Background(), &v1.UpdateNodeRequest{Name: env.node, UpdateMask: []string{"macs"}, Macs: []string{mac}}); err != nil {
			t.Fatalf("give the node its MAC: %v", err)
		}
	}
	return env
}

// netbootConsoleChecks are what a netbooted node's console must show: the
// firmware's iPXE, the agent configuring the boot interface by DHCP, and
// the boot through to ready.
func checkNetbootConsole(t *testing.T, console, mac string) {
	t.Helper()
	for _, want := range []string{"iPXE", "boot: network up: DHCP on", "(" + mac + ")", "boot interface", "phase ready"} {
		if !strings.Contains(console, want) {
			t.Errorf("console lacks %q:\n%s", want, tail(console, 4000))
		}
	}
}

// TestVMNetbootBIOSUserNet: SeaBIOS, the NIC's iPXE ROM, QEMU's own DHCP
// pointing it at /ipxe/boot?mac=, the agent's DHCP: the cheapest real
// firmware boot, with no namespace. (UEFI runs in TestVMNetbootNamespace,
// against tetherd's own DHCP.)
func TestVMNetbootBIOSUserNet(t *testing.T) {
	const mac = "52:54:00:0e:2e:01"
	env := newNetbootEnv(t, "bios", mac)
	ctx := vmCtx(t)
	id := env.provision(t, ctx)
	env.waitRunning(t, ctx, id, nil)
	checkNetbootConsole(t, env.console(ctx, id), mac)
	if os.Getenv("TETHER_E2E_CONSOLE") != "" {
		t.Logf("console:\n%s", env.console(ctx, id))
	}
	// The VM booted with nothing handed to it directly.
	argv, _ := exec.Command("ps", "-o", "args=", "-p", qemuPID(id)).Output()
	for _, bad := range []string{"-kernel", "-initrd", "fw_cfg"} {
		if strings.Contains(string(argv), bad) {
			t.Errorf("a netbooting VM was started with %s: %s", bad, argv)
		}
	}
}
