package events

import "github.com/tetherfleet/tether/controlplane/store"

// NetbootMachineRefused records a machine that asked the boot route
// (/ipxe/boot?mac=) and was turned away: an unknown hardware address, a
// node with no booting instance, or a malformed request. Its payload names
// the mac (when it parsed) and a reason code (Refused* below), so that an
// operator can adopt an unknown machine.
const NetbootMachineRefused store.EventKind = "netboot.refused"

// NetbootUKIServed records a unified kernel image downloaded by a
// booting machine (GET /uki/boot?mac=): the instance, the template and
// the image's digest.
const NetbootUKIServed store.EventKind = "netboot.uki_served"

// Reason codes of NetbootMachineRefused.
const (
	RefusedMalformed     = "malformed_request"
	RefusedUnknownMAC    = "unknown_mac"
	RefusedNotBooting    = "no_booting_instance"
	RefusedNodeAmbiguous = "several_booting_instances"
	// RefusedMalformedAnnounce is an announcement (NetbootAnnounced) that
	// was too large or did not parse: no TPM key, no hardware address.
	RefusedMalformedAnnounce = "malformed_announce"
)

// NetbootAnnounced records an unknown machine, booted to announce itself,
// that sent its hardware address and its TPM's endorsement key (docs/adr/
// 0030). The payload names the mac, the ek hash, whether an EK certificate
// came with it (and its issuer), and the sender; its correlation id is
// "mac:" and the address, so an adoption reads what was announced for a
// MAC. It is a hint for an admin, not a binding: anyone on the
// provisioning network can announce anything.
const NetbootAnnounced store.EventKind = "netboot.announced"

// AnnounceCorrelation is the correlation id of the NetbootAnnounced events
// of mac: an adoption reads what was announced for a MAC by it.
func AnnounceCorrelation(mac string) store.CorrelationID {
	return store.CorrelationID("mac:" + mac)
}

// NodeAdopted records an admin's adoption of a machine seen netbooting:
// its MAC and its EK bound to a node, created or updated, in one call
// (docs/adr/0030). The payload names the node, the mac, the ek, whether
// the node was created and whether the EK had been announced for the MAC.
const NodeAdopted store.EventKind = "node.adopted"
