package modules

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"strings"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/pki"
)

// Signatures are checked when they arrive, against the signer keys the
// control plane knows (registered with AddSigner, or given to tetherd with
// --module-signing-key). A signature that does not verify is refused rather
// than stored: "signed" in a listing must mean something.

// SignatureIn is a signature as a client sends it: the signer's public key
// (nil when the client sent only the raw signature) and the signature.
type SignatureIn struct {
	PublicKey []byte
	Signature []byte
}

// AddSigner registers an Ed25519 public key under name. The caller checks
// the shapes (a valid name, a key of ed25519.PublicKeySize bytes); a
// second signer with the same name or key is refused with AlreadyExists.
func (r *Registry) AddSigner(ctx context.Context, name string, publicKey ed25519.PublicKey) (*store.Signer, error) {
	s := &store.Signer{Name: name, Fingerprint: pki.SignerFingerprint(publicKey), PublicKey: publicKey, CreatedAt: r.Clock.Now()}
	err := r.Store.Tx(ctx, func(q store.Queries) error { return q.CreateSigner(ctx, s) })
	if errors.Is(err, store.ErrAlreadyExists) {
		return nil, fail.Exists("a signer named %q or with fingerprint %s is already registered", s.Name, s.Fingerprint)
	}
	if err != nil {
		return nil, err
	}
	return s, nil
}

// RemoveSigner forgets a registered signer, named by its name or its
// sha256: fingerprint.
func (r *Registry) RemoveSigner(ctx context.Context, signer string) error {
	return r.Store.Tx(ctx, func(q store.Queries) error { return q.DeleteSigner(ctx, signer) })
}

// Signers returns every signer signatures may verify with: the registered
// ones, then the static ones from the daemon's flags.
func (r *Registry) Signers(ctx context.Context) ([]store.Signer, error) {
	reg, err := r.Store.ListSigners(ctx)
	if err != nil {
		return nil, fmt.Errorf("load signers: %w", err)
	}
	out := make([]store.Signer, 0, len(reg)+len(r.StaticSigners))
	seen := map[string]bool{}
	for _, s := range reg {
		out, seen[s.Fingerprint] = append(out, *s), true
	}
	for _, k := range r.StaticSigners {
		fp := pki.SignerFingerprint(k)
		if !seen[fp] {
			out, seen[fp] = append(out, store.Signer{Name: "--module-signing-key " + fp[:19], Fingerprint: fp, PublicKey: k}), true
		}
	}
	return out, nil
}

// verifySignatures checks every signature over (name, version, digest) and
// returns them as they are stored. field names the request field for errors.
func verifySignatures(signers []store.Signer, name, version, digest, field string, in []SignatureIn, now func() store.ModuleSignature) ([]store.ModuleSignature, error) {
	if len(in) == 0 {
		return nil, nil
	}
	if len(signers) == 0 {
		return nil, fail.Precondition("module %s:%s carries a signature, but no signer keys are configured to check it against; "+
			"add the signer's public key first (`tetherctl signer add NAME --key FILE.pub`), or push without a signature", name, version)
	}
	byFP := make(map[string]store.Signer, len(signers))
	for _, s := range signers {
		byFP[s.Fingerprint] = s
	}
	var out []store.ModuleSignature
	for i, s := range in {
		f := fmt.Sprintf("%s[%d]", field, i)
		if len(s.Signature) != ed25519.SignatureSize {
			return nil, fail.Invalid(f, "an Ed25519 signature is %d bytes, got %d", ed25519.SignatureSize, len(s.Signature))
		}
		var match *store.Signer
		if len(s.PublicKey) > 0 {
			if len(s.PublicKey) != ed25519.PublicKeySize {
				return nil, fail.Invalid(f+".public_key", "an Ed25519 public key is %d bytes, got %d", ed25519.PublicKeySize, len(s.PublicKey))
			}
			fp := pki.SignerFingerprint(s.PublicKey)
			signer, ok := byFP[fp]
			if !ok {
				return nil, fail.Precondition("module %s:%s: signer %s is not a registered signer (register it with `tetherctl signer add`)", name, version, fp)
			}
			if !pki.VerifyModule(signer.PublicKey, name, version, digest, s.Signature) {
				return nil, fail.Invalid(f, "the signature by %s (%s) does not verify over module %s:%s digest %s (signed another module, version or digest?)", signer.Name, fp, name, version, digest)
			}
			match = &signer
		} else {
			for j := range signers {
				if pki.VerifyModule(signers[j].PublicKey, name, version, digest, s.Signature) {
					match = &signers[j]
					break
				}
			}
			if match == nil {
				return nil, fail.Invalid(f, "the signature over module %s:%s digest %s verifies with none of the %d configured signers", name, version, digest, len(signers))
			}
		}
		rec := now()
		rec.Signer, rec.SignerName, rec.PublicKey, rec.Signature = match.Fingerprint, match.Name, append([]byte(nil), match.PublicKey...), s.Signature
		out = append(out, rec)
	}
	return out, nil
}

// Sign attaches a signature to a pushed module after checking it.
func (r *Registry) Sign(ctx context.Context, name, version string, sig SignatureIn) (*store.Module, error) {
	if err := ValidateName("name", name); err != nil {
		return nil, err
	}
	if err := ValidateVersion("version", version); err != nil {
		return nil, err
	}
	m, err := r.Store.GetModule(ctx, name, version)
	if err != nil {
		return nil, err
	}
	signers, err := r.Signers(ctx)
	if err != nil {
		return nil, err
	}
	now := r.Clock.Now()
	recs, err := verifySignatures(signers, name, version, m.Digest, "signature", []SignatureIn{sig}, func() store.ModuleSignature { return store.ModuleSignature{CreatedAt: now} })
	if err != nil {
		return nil, err
	}
	err = r.Store.Tx(ctx, func(q store.Queries) error {
		if err := q.AddModuleSignature(ctx, name, version, recs[0]); err != nil {
			return err
		}
		_, err := events.E{Kind: events.ModuleSigned, Message: fmt.Sprintf("module %s:%s signed by %s (%s)", name, version, recs[0].SignerName, recs[0].Signer),
			Payload: events.ModuleSignedPayload{Digest: m.Digest, Name: name, Signer: recs[0].Signer, Version: version}}.Write(ctx, q, now)
		return err
	})
	if err != nil {
		return nil, err
	}
	return r.Store.GetModule(ctx, name, version)
}

// MissingSigner returns, for a module, why it fails a template's required
// signers: "" when one of them signed it.
func MissingSigner(m *store.Module, required []string) string {
	if len(required) == 0 {
		return ""
	}
	for _, s := range m.Signatures {
		for _, fp := range required {
			if s.Signer == fp && pki.VerifyModule(s.PublicKey, m.Name, m.Version, m.Digest, s.Signature) {
				return ""
			}
		}
	}
	if len(m.Signatures) == 0 {
		return fmt.Sprintf("module %s:%s is unsigned; it needs a signature by %s", m.Name, m.Version, strings.Join(required, " or "))
	}
	return fmt.Sprintf("module %s:%s has no signature by %s", m.Name, m.Version, strings.Join(required, " or "))
}

// CheckTemplateSigners refuses a template whose modules its own required
// signers did not sign: the control plane's second line of defence (the
// node's anchor is the first), checked when a template is written and
// again when an instance is provisioned from it, so neither an operator
// nor a pool ever starts a machine that would refuse its root.
func CheckTemplateSigners(ctx context.Context, q store.ModuleQueries, t *store.Template) error {
	if len(t.RequiredSigners) == 0 {
		return nil
	}
	for _, r := range append(append([]store.ModuleRef(nil), t.RootModules...), t.ExtensionModules...) {
		m, err := q.GetModule(ctx, r.Name, r.Version)
		if err != nil {
			return err
		}
		if why := MissingSigner(m, t.RequiredSigners); why != "" {
			return fail.Precondition("template %q requires signed modules: %s (sign it with `tetherctl module sign %s:%s --key FILE`)", t.Name, why, m.Name, m.Version)
		}
	}
	return nil
}
