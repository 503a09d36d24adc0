package events

// NetbootMachineRefused records a machine that asked the boot route
// (/ipxe/boot?mac=) and was turned away: an unknown hardware address, a
// node with no booting instance, or a malformed request. Its payload names
// the mac (when it parsed) and a reason code (Refused* below), so that an
// operator can adopt an unknown machine.
const NetbootMachineRefused = "netboot.refused"

// NetbootUKIServed records a unified kernel image downloaded by a
// booting machine (GET /uki/boot?mac=): the instance, the template and
// the image's digest.
const NetbootUKIServed = "netboot.uki_served"

// Reason codes of NetbootMachineRefused.
const (
	RefusedMalformed     = "malformed_request"
	RefusedUnknownMAC    = "unknown_mac"
	RefusedNotBooting    = "no_booting_instance"
	RefusedNodeAmbiguous = "several_booting_instances"
)
