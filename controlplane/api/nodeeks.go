package api

import (
	"context"
	"errors"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/pki/attestation"
)

// maxNodeEKs bounds a node's endorsement keys: a machine has one TPM, and
// a few hashes cover a replaced board or an RSA and an ECC EK.
const maxNodeEKs = 8

// ekPrefix is the one algorithm an EK hash names: SHA-256 of the EK
// public key (docs/design.md §3.8).
const ekPrefix = "sha256:"

// nodeEKHashes validates a node's EK hashes: sha256: and 64 hex digits.
// Upper-case hex is accepted and stored lower-case, so a hash copied from
// a tool that prints upper case names the same key; any other form is
// refused with the field and the value.
func nodeEKHashes(in []string) ([]string, error) {
	if len(in) > maxNodeEKs {
		return nil, fail.Invalid("ek_hashes", "%d endorsement keys is more than %d", len(in), maxNodeEKs)
	}
	out := make([]string, 0, len(in))
	seen := map[string]bool{}
	for _, s := range in {
		h, err := parseEKHash(s)
		if err != nil {
			return nil, fail.Invalid("ek_hashes", "%v", err)
		}
		if seen[h] {
			return nil, fail.Invalid("ek_hashes", "endorsement key %s is given twice", h)
		}
		seen[h] = true
		out = append(out, h)
	}
	return out, nil
}

// parseEKHash is the one form of an EK hash, shared with the attested
// enrollment that computes it.
func parseEKHash(s string) (string, error) { return attestation.ParseEKHash(s) }

// attestationNeedsAdmin refuses an identity below admin that sets a
// node's EK hashes or a require_attestation flag: binding a TPM decides
// which machine may become the node without a token, and clearing the
// requirement makes a stolen token good again (docs/adr/0024).
func attestationNeedsAdmin(ctx context.Context, field string) error {
	c, ok := CallerFrom(ctx)
	if !ok {
		return fail.Denied("setting %s needs role admin; the call names no caller", field)
	}
	if roleRank[c.Identity.Role] < roleRank[RoleAdmin] {
		return fail.Denied("setting %s needs role admin: it decides which machine may enroll as the node; identity %s has role %s", field, c.Identity.Name, c.Identity.Role)
	}
	return nil
}

// ekConflict answers a node write that names another node's EK: the
// write changed nothing, and a high-severity event names the hash and
// both nodes, because a TPM seen on a second node is either a typo or a
// machine that moved, and an operator must decide which.
func (a *adminServer) ekConflict(ctx context.Context, node string, err error) error {
	var inUse *store.EKInUseError
	if !errors.As(err, &inUse) {
		return err
	}
	if _, werr := events.EKConflict(inUse.EK, inUse.Node, node, "an admin node write").Write(ctx, a.Store, a.Clock.Now()); werr != nil && a.Log != nil {
		a.Log.Error("write endorsement key conflict event", "node", node, "ek_hash", inUse.EK, "err", werr)
	}
	return fail.Exists("ek_hashes: %v; remove it from node %q first (tetherctl node update %s --ek ...)", inUse, inUse.Node, inUse.Node)
}
