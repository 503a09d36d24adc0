package api

import (
	"context"
	"errors"

	"github.com/tetherfleet/tether/controlplane/catalog"
	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/macaddr"
	"github.com/tetherfleet/tether/pki/attestation"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
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
	if !store.Role(c.Identity.Role).AtLeast(RoleAdmin) {
		return fail.Denied("setting %s needs role admin: it decides which machine may enroll as the node; identity %s has role %s", field, c.Identity.Name, c.Identity.Role)
	}
	return nil
}

// ekConflict answers a node write that names another node's EK: the
// write changed nothing, and a high-severity event names the hash and
// both nodes, because a TPM seen on a second node is either a typo or a
// machine that moved, and an operator must decide which.
func (a *adminServer) ekConflict(ctx context.Context, node string, err error) error {
	return a.ekConflictBy(ctx, node, "an admin node write", err)
}

// ekConflictBy is ekConflict for a write described by how.
func (a *adminServer) ekConflictBy(ctx context.Context, node, how string, err error) error {
	var inUse *store.EKInUseError
	if !errors.As(err, &inUse) {
		return err
	}
	if _, werr := events.EKConflict(inUse.EK, inUse.Node, node, how).Write(ctx, a.Store, a.Clock.Now()); werr != nil && a.Log != nil {
		a.Log.Error("write endorsement key conflict event", "node", node, "ek_hash", inUse.EK, "err", werr)
	}
	return fail.Exists("ek_hashes: %v; remove it from node %q first (tetherctl node update %s --ek ...)", inUse, inUse.Node, inUse.Node)
}

// AdoptNode binds a machine seen netbooting, by its hardware address and
// the endorsement key it announced, to a node it creates or updates, in
// one audited transaction (docs/adr/0030). Admin only, as every EK
// binding is (docs/adr/0024).
func (a *adminServer) AdoptNode(ctx context.Context, req *v1.AdoptNodeRequest) (*v1.AdoptNodeResponse, error) {
	mac, err := macaddr.Normalize(req.Mac)
	if err != nil {
		return nil, fail.Invalid("mac", "%v", err)
	}
	var ek string
	if req.EkHash != "" {
		if ek, err = parseEKHash(req.EkHash); err != nil {
			return nil, fail.Invalid("ek_hash", "%v", err)
		}
	} else if req.Unseen {
		return nil, fail.Invalid("unseen", "needs ek_hash: --unseen binds a hash given with --ek that no machine announced")
	}
	if req.Name != "" {
		if err := modules.ValidateName("name", req.Name); err != nil {
			return nil, err
		}
	}
	if req.Template != "" {
		if err := modules.ValidateName("template", req.Template); err != nil {
			return nil, err
		}
	}
	if err := attestationNeedsAdmin(ctx, "a node's ek_hashes (by adoption)"); err != nil {
		return nil, err
	}
	res, err := a.Catalog.AdoptNode(ctx, catalog.Adoption{MAC: mac, EKHash: ek, Name: req.Name, Template: req.Template, Unseen: req.Unseen,
		MaxMACs: maxNodeMACs, MaxEKs: maxNodeEKs})
	var inUse *store.MACInUseError
	if errors.As(err, &inUse) {
		return nil, fail.Exists("mac: %v", inUse)
	}
	if err != nil {
		name := req.Name
		if name == "" {
			name = "(the node of " + mac + ")"
		}
		return nil, a.ekConflictBy(ctx, name, "an admin adoption of "+mac, err)
	}
	return &v1.AdoptNodeResponse{Node: nodeProto(res.Node, res.Template), Created: res.Created, Announced: res.Announced}, nil
}
