package providers

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
