package pki

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"time"
)

// BundleRoot is one root of a trust bundle and its cross certificate: the
// same name and key signed by the CA that was active when this root was
// prepared (nil for the first CA).
type BundleRoot struct {
	Root  *x509.Certificate
	Cross *x509.Certificate
}

// ExtendTrust returns the roots of bundle a node may trust, given the
// fingerprints it trusts already (its pin, and any root it accepted
// before) and the certificates it holds for them. A root is accepted if
// its fingerprint is trusted, or if its cross certificate names it
// exactly (subject and key) and is signed, and valid at now, by a root
// accepted already; so each new root chains to the pin, whatever the
// channel that delivered it. Roots that chain to nothing trusted are
// returned in refused with the reason.
func ExtendTrust(trusted map[string]bool, bundle []BundleRoot, now time.Time) (accepted []*x509.Certificate, refused []error) {
	done := make([]bool, len(bundle))
	var have []*x509.Certificate
	for progress := true; progress; {
		progress = false
		for i, b := range bundle {
			if done[i] || b.Root == nil {
				continue
			}
			if trusted[Fingerprint(b.Root.Raw)] || crossSigned(b, have, now) == nil {
				done[i], progress = true, true
				have = append(have, b.Root)
			}
		}
	}
	for i, b := range bundle {
		if done[i] {
			continue
		}
		if b.Root == nil {
			refused = append(refused, errors.New("bundle entry without a root"))
			continue
		}
		refused = append(refused, fmt.Errorf("root %s: %w", Fingerprint(b.Root.Raw), crossSigned(b, have, now)))
	}
	return have, refused
}

// ErrNoCross refuses a root the node does not trust that comes without a
// cross certificate: an older root of the set, which a node pinned to a
// newer one has no need of.
var ErrNoCross = errors.New("not trusted and no cross certificate")

// crossSigned says why b's root does not chain to one of roots, or nil.
func crossSigned(b BundleRoot, roots []*x509.Certificate, now time.Time) error {
	r, x := b.Root, b.Cross
	if x == nil {
		return ErrNoCross
	}
	if !r.IsCA || !bytes.Equal(r.RawIssuer, r.RawSubject) {
		return errors.New("not a self-signed CA certificate")
	}
	if err := r.CheckSignatureFrom(r); err != nil {
		return fmt.Errorf("self-signature: %w", err)
	}
	if !bytes.Equal(x.RawSubjectPublicKeyInfo, r.RawSubjectPublicKeyInfo) || !bytes.Equal(x.RawSubject, r.RawSubject) {
		return errors.New("its cross certificate names another CA")
	}
	if now.Before(x.NotBefore) || now.After(x.NotAfter) {
		return fmt.Errorf("its cross certificate is valid from %s to %s only", x.NotBefore.UTC().Format(time.RFC3339), x.NotAfter.UTC().Format(time.RFC3339))
	}
	for _, t := range roots {
		if bytes.Equal(x.RawIssuer, t.RawSubject) && x.CheckSignatureFrom(t) == nil {
			return nil
		}
	}
	return errors.New("its cross certificate is signed by no trusted root")
}

// ServerRoots are the roots a control plane's TLS chain is verified
// against, for a client that trusts the fingerprints in trusted and holds
// the certificates known: those, every presented certificate with a
// trusted fingerprint, and every presented root that a presented cross
// certificate chains to one of them (after a CA rotation's activate the
// server's leaf is signed by the new CA, and it presents the new root
// with its cross certificate by the old one, so a node pinned to the old
// one still verifies it). Nothing is trusted that does not chain to
// trusted.
func ServerRoots(presented []*x509.Certificate, trusted map[string]bool, known []*x509.Certificate, now time.Time) []*x509.Certificate {
	var bundle []BundleRoot
	for _, c := range known {
		bundle = append(bundle, BundleRoot{Root: c})
	}
	var crosses []*x509.Certificate
	for _, c := range presented {
		if c.IsCA && !bytes.Equal(c.RawIssuer, c.RawSubject) {
			crosses = append(crosses, c)
		}
	}
	for _, c := range presented {
		if !c.IsCA || !bytes.Equal(c.RawIssuer, c.RawSubject) {
			continue
		}
		b := BundleRoot{Root: c}
		for _, x := range crosses {
			if bytes.Equal(x.RawSubject, c.RawSubject) && bytes.Equal(x.RawSubjectPublicKeyInfo, c.RawSubjectPublicKeyInfo) {
				// A root may have several crosses (one per rotation that
				// chained it): one entry per cross.
				bundle = append(bundle, BundleRoot{Root: c, Cross: x})
				b.Root = nil
			}
		}
		if b.Root != nil {
			bundle = append(bundle, b)
		}
	}
	accepted, _ := ExtendTrust(trusted, bundle, now)
	return accepted
}
