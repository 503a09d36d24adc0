package providers

import (
	"fmt"
	"net"
	"net/url"
	"strings"
)

// Netbooter is implemented by providers whose machines may boot from their
// firmware over the network (DHCP, TFTP/HTTP, iPXE) rather than being
// handed a kernel, an initramfs and a token directly. When Netboots is
// true the control plane gives the machine a hardware address (the node's
// first, or a generated one it records on the node) and issues no token
// with the boot: the machine's per-boot script carries it. The netboot
// server serves /ipxe/{id} scripts only to instances whose provider says it
// netboots them: anyone who can reach the port can ask for any instance's
// script, and a provider that boots its machines another way would leave
// that script's token for a stranger. A provider that does not implement
// it does not netboot.
type Netbooter interface {
	Netboots() bool
}

// BootScriptPath is the control plane's boot route for a hardware address
// (what tetherd's DHCP hands iPXE, and what QEMU's user-mode DHCP hands it
// for the qemu and libvirt providers).
func BootScriptPath(mac string) string { return "/ipxe/boot?mac=" + mac }

// UKIBootPath is the control plane's route for the signed unified kernel
// image of a hardware address's node: what UEFI HTTP Boot loads, with no
// iPXE in between.
func UKIBootPath(mac string) string { return "/uki/boot?mac=" + mac }

// UserNetBootFile is what QEMU's user-mode DHCP hands a netbooting guest's
// iPXE: the boot route on the server that serves the boot's kernel (the
// guest reaches the host as 10.0.2.2, which is how the control plane
// writes its URLs).
func UserNetBootFile(b Boot, mac string) (string, error) {
	u, err := url.Parse(b.KernelURL)
	if err != nil || b.KernelURL == "" || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("netboot over QEMU's user-mode network needs the netboot server's URL (kernel URL %q); start tetherd with its netboot server", b.KernelURL)
	}
	return u.Scheme + "://" + u.Host + BootScriptPath(mac), nil
}

// CheckNICAddress validates a virtual NIC's hardware address: QEMU takes
// six colon-separated hex bytes, and a multicast address cannot be a NIC's.
func CheckNICAddress(mac string) error {
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 || hw[0]&1 != 0 || strings.ContainsAny(mac, "-.") {
		return fmt.Errorf("hardware address %q is not a unicast MAC in colon form", mac)
	}
	return nil
}

// NodeHardware is implemented by providers whose machine is the node's
// own server (redfish: the computer behind the node's BMC) rather than one
// the provider creates. Such a provider has at most one machine a node, so
// a pool lends it existing nodes of its template instead of making new
// ones. A provider that does not implement it creates its machines.
type NodeHardware interface {
	MachinesAreNodes() bool
}

// MachinesAreNodes reports whether p's machines are its nodes' own servers.
func MachinesAreNodes(p Provider) bool {
	nh, ok := p.(NodeHardware)
	return ok && nh.MachinesAreNodes()
}
