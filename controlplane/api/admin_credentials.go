package api

// A node's BMC settings, which the node RPCs take; the credential RPCs
// themselves are in admin/credentials.

import (
	"context"
	"errors"
	"strings"

	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
	"github.com/tetherfleet/tether/providers/redfish"
)

// maxBMCCA bounds a BMC's CA bundle: a few certificates.
const maxBMCCA = 64 << 10

// nodeBMC validates a node's BMC settings; nil means none.
func nodeBMC(in *v1.NodeBMC) (store.NodeBMC, error) {
	if in == nil {
		return store.NodeBMC{}, nil
	}
	if in.Address == "" {
		return store.NodeBMC{}, fail.Invalid("bmc.address", "required (redfish://HOST[:PORT]/redfish/v1/Systems/ID)")
	}
	if len(in.Address) > 2048 {
		return store.NodeBMC{}, fail.Invalid("bmc.address", "longer than 2048 characters")
	}
	if _, err := redfish.ParseEndpoint(in.Address); err != nil {
		return store.NodeBMC{}, fail.Invalid("bmc.address", "%v", err)
	}
	if in.Credential == "" {
		return store.NodeBMC{}, fail.Invalid("bmc.credential", "required: the name of a credential (tetherctl credential create)")
	}
	out := store.NodeBMC{Address: in.Address, Credential: in.Credential, Insecure: in.InsecureSkipVerify}
	if in.CaPem != "" {
		if len(in.CaPem) > maxBMCCA {
			return store.NodeBMC{}, fail.Invalid("bmc.ca_pem", "%d bytes is more than %d", len(in.CaPem), maxBMCCA)
		}
		if _, err := redfish.ParseCA([]byte(in.CaPem)); err != nil {
			return store.NodeBMC{}, fail.Invalid("bmc.ca_pem", "%v", err)
		}
		out.CAPEM = in.CaPem
	}
	if in.Fingerprint != "" {
		fp, err := redfish.ParseFingerprint(in.Fingerprint)
		if err != nil {
			return store.NodeBMC{}, fail.Invalid("bmc.fingerprint", "%v", err)
		}
		out.Fingerprint = fp
	}
	if out.Insecure && (out.CAPEM != "" || out.Fingerprint != "") {
		return store.NodeBMC{}, fail.Invalid("bmc.insecure_skip_verify", "contradicts bmc.ca_pem and bmc.fingerprint: verify the BMC or skip verification, not both")
	}
	switch strings.ToLower(in.BootMode) {
	case "":
	case "uefi":
		out.BootMode = redfish.ModeUEFI
	case "legacy", "bios":
		out.BootMode = redfish.ModeLegacy
	default:
		return store.NodeBMC{}, fail.Invalid("bmc.boot_mode", "%s is not UEFI or Legacy", quoteSome(in.BootMode))
	}
	return out, nil
}

// checkNodeBMC refuses a BMC whose credential does not exist, or a BMC on
// a node without a hardware address (its machine netboots by MAC).
func checkNodeBMC(ctx context.Context, q store.Queries, n *store.Node) error {
	if n.BMC.Address == "" {
		return nil
	}
	if len(n.MACs) == 0 {
		return fail.Invalid("macs", "node %s has a BMC but no hardware address: its machine netboots by its NIC's MAC (--mac)", n.Name)
	}
	if _, err := q.GetCredential(ctx, n.BMC.Credential); errors.Is(err, store.ErrNotFound) {
		return fail.Invalid("bmc.credential", "credential %q does not exist (tetherctl credential create %s --username U --password-file F)", n.BMC.Credential, n.BMC.Credential)
	} else if err != nil {
		return err
	}
	return nil
}
