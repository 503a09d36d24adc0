package enroll

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/tetherfleet/tether/pki"
)

// PinMismatchError means no certificate the server presented has the pinned
// CA fingerprint: either the fingerprint handed to the node is wrong or
// something between the node and the control plane is not the control
// plane.
type PinMismatchError struct {
	Server   string
	Expected string
	// Seen are the fingerprints of the presented certificates, leaf first,
	// each followed by its subject in parentheses.
	Seen []string
}

func (e *PinMismatchError) Error() string {
	return fmt.Sprintf("CA fingerprint mismatch at %s: expected %s, the server presented %s. "+
		"Either this node was handed the wrong tether.ca, or something other than the control plane answered. "+
		"`tetherctl ca list` shows the control plane's CAs (the active one is what boots are handed; a retired one no longer enrolls; "+
		"a control plane that never rotated has one, `openssl x509 -in DATA_DIR/ca.crt -outform der | sha256sum`); "+
		"if the expected value is none of them, re-provision the node with the active fingerprint; if it is, find what is intercepting %s",
		e.Server, e.Expected, strings.Join(e.Seen, ", "), e.Server)
}

// Pin verifies a control plane's TLS certificate against a pinned CA
// fingerprint rather than the system roots (an initramfs has none, and a
// node must trust only its own control plane's CA).
type Pin struct {
	fingerprint string
	serverName  string
	now         func() time.Time

	mu sync.Mutex
	// trusted are the roots this node trusts for its control plane: the
	// pinned one, and those a trust bundle chained to it (design §3.10).
	// A fingerprint maps to its certificate once one was seen (nil
	// before).
	trusted map[string]*x509.Certificate
	// bundle is every bundle entry accepted: the chains from the pin,
	// saved and checked again at reload.
	bundle   []pki.BundleRoot
	mismatch *PinMismatchError
}

// NewPin pins fingerprint ("sha256:<hex>") for connections to serverName
// (a host name or IP address, checked against the leaf's SANs).
func NewPin(fingerprint, serverName string, now func() time.Time) (*Pin, error) {
	fp, err := pki.ParseFingerprint(fingerprint)
	if err != nil {
		return nil, err
	}
	if serverName == "" {
		return nil, errors.New("pin: empty server name")
	}
	if now == nil {
		now = time.Now
	}
	return &Pin{fingerprint: fp, serverName: serverName, now: now, trusted: map[string]*x509.Certificate{fp: nil}}, nil
}

// Fingerprint returns the pinned fingerprint.
func (p *Pin) Fingerprint() string { return p.fingerprint }

// SetKnownCA supplies the CA certificate from an earlier enrollment, so a
// server that sends only its leaf can still be checked. It must be the
// pinned CA or one a trust bundle chained to it.
func (p *Pin) SetKnownCA(ca *x509.Certificate) error {
	fp := pki.Fingerprint(ca.Raw)
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.trusted[fp]; !ok {
		return fmt.Errorf("saved CA certificate has fingerprint %s, but the pin is %s and no trust bundle chained it to the pin", fp, p.fingerprint)
	}
	p.trusted[fp] = ca
	return nil
}

// Trusts reports whether fp is the pin or a root chained to it.
func (p *Pin) Trusts(fp string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.trusted[fp]
	return ok
}

// Trust takes a trust bundle from the control plane: the roots the node
// trusts become those of bundle that chain to the pin (pki.ExtendTrust,
// through every entry accepted before, so a root whose predecessors were
// retired still chains), and a root the bundle no longer lists (a retired
// CA), the pinned one included, is trusted no more. It returns the
// fingerprints new to the node and why any entry was refused. A bundle
// none of whose roots chain to the pin changes nothing.
func (p *Pin) Trust(bundle []pki.BundleRoot) (added []string, refused []error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	accepted, refused := pki.ExtendTrust(map[string]bool{p.fingerprint: true}, append(append([]pki.BundleRoot(nil), p.bundle...), bundle...), p.now())
	ok := map[string]*x509.Certificate{}
	for _, root := range accepted {
		ok[pki.Fingerprint(root.Raw)] = root
	}
	current := map[string]*x509.Certificate{}
	for _, b := range bundle {
		if b.Root == nil {
			continue
		}
		fp := pki.Fingerprint(b.Root.Raw)
		if root, good := ok[fp]; good {
			current[fp] = root
			if !containsEntry(p.bundle, b) {
				p.bundle = append(p.bundle, b)
			}
		}
	}
	if len(current) == 0 {
		return nil, refused
	}
	for fp := range current {
		if _, had := p.trusted[fp]; !had {
			added = append(added, fp)
		}
	}
	p.trusted = current
	return added, refused
}

// Restore brings back what Trust saved: the entries accepted before
// (checked again against the pin) and the fingerprints in use. With no
// fingerprint in use that still chains, the pin alone is trusted.
func (p *Pin) Restore(entries []pki.BundleRoot, current []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	accepted, _ := pki.ExtendTrust(map[string]bool{p.fingerprint: true}, entries, p.now())
	ok := map[string]*x509.Certificate{}
	for _, root := range accepted {
		ok[pki.Fingerprint(root.Raw)] = root
	}
	trusted := map[string]*x509.Certificate{}
	for _, fp := range current {
		if root, good := ok[fp]; good {
			trusted[fp] = root
		}
	}
	for _, e := range entries {
		if e.Root != nil && ok[pki.Fingerprint(e.Root.Raw)] != nil && !containsEntry(p.bundle, e) {
			p.bundle = append(p.bundle, e)
		}
	}
	if len(trusted) > 0 {
		p.trusted = trusted
	}
}

func containsEntry(bs []pki.BundleRoot, e pki.BundleRoot) bool {
	for _, b := range bs {
		if b.Root.Equal(e.Root) && (b.Cross == nil) == (e.Cross == nil) && (b.Cross == nil || b.Cross.Equal(e.Cross)) {
			return true
		}
	}
	return false
}

// Bundle is every bundle entry this pin accepted (the chain from the pin
// to each root, retired ones included) and the fingerprints trusted now,
// to save.
func (p *Pin) Bundle() ([]pki.BundleRoot, []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var current []string
	for fp := range p.trusted {
		current = append(current, fp)
	}
	sort.Strings(current)
	return append([]pki.BundleRoot(nil), p.bundle...), current
}

// TakeMismatch returns and clears the last pin mismatch seen. gRPC folds
// handshake errors into an Unavailable status string, so the typed error
// travels through here instead.
func (p *Pin) TakeMismatch() *PinMismatchError {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.mismatch
	p.mismatch = nil
	return m
}

// TLSConfig returns a client configuration that trusts only the pinned CA.
// getCert, when non-nil, supplies the client certificate at each handshake
// (so renewals apply to new connections without rebuilding anything).
func (p *Pin) TLSConfig(getCert func() *tls.Certificate) *tls.Config {
	cfg := &tls.Config{
		ServerName: p.serverName,
		MinVersion: tls.VersionTLS13,
		// The standard verification checks against system roots, which an
		// initramfs does not have and which a node must not trust anyway;
		// VerifyConnection below does the whole check against the pin.
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection
		VerifyConnection:   p.verify,
	}
	if getCert != nil {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if c := getCert(); c != nil {
				return c, nil
			}
			return &tls.Certificate{}, nil
		}
	}
	return cfg
}

// verify accepts the connection only if one of the presented certificates
// (or the CA saved at enrollment) has the pinned fingerprint and the leaf
// chains to it and names serverName.
func (p *Pin) verify(cs tls.ConnectionState) error { return p.verifyName(cs, p.serverName) }

// verifyName is verify for a connection to serverName: with several
// control planes, the one the connection reached.
func (p *Pin) verifyName(cs tls.ConnectionState, serverName string) error {
	certs := cs.PeerCertificates
	if len(certs) == 0 {
		return errors.New("control plane presented no certificate")
	}
	// Roots: every trusted root it holds (a server may send only its
	// leaf), every presented certificate it trusts, and every presented
	// root a presented cross certificate chains to one of those (a
	// rotation's new CA, before this node heard of it).
	p.mu.Lock()
	fps := make(map[string]bool, len(p.trusted))
	var known []*x509.Certificate
	for fp, c := range p.trusted {
		fps[fp] = true
		if c != nil {
			known = append(known, c)
		}
	}
	trustedRoots := pki.ServerRoots(certs, fps, known, p.now())
	roots := x509.NewCertPool()
	for _, c := range trustedRoots {
		roots.AddCert(c)
	}
	if len(trustedRoots) == 0 {
		m := &PinMismatchError{Server: p.serverName, Expected: p.fingerprint}
		for _, c := range certs {
			m.Seen = append(m.Seen, fmt.Sprintf("%s (%s)", pki.Fingerprint(c.Raw), describeCert(c)))
		}
		p.mismatch = m
		p.mu.Unlock()
		return m
	}
	p.mu.Unlock()

	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	_, err := certs[0].Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: inter,
		DNSName:       serverName,
		CurrentTime:   p.now(),
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return fmt.Errorf("control plane certificate %s does not verify against the pinned CA %s (or a root chained to it): %w", describeCert(certs[0]), p.fingerprint, err)
	}
	return nil
}

func describeCert(c *x509.Certificate) string {
	if c.Subject.CommonName != "" {
		return "CN=" + c.Subject.CommonName
	}
	if len(c.DNSNames) > 0 {
		return "DNS:" + c.DNSNames[0]
	}
	return "serial " + c.SerialNumber.String()
}

// Transient says whether waiting may fix an enrollment error: the control
// plane unreachable, slow, refusing for load or asking for a retry. A
// pin mismatch never is (another server answered), nor a refusal. The
// agent retries these, and so does the fleet simulator, so that both
// count the same failures.
func Transient(err error) bool {
	var pm *PinMismatchError
	if errors.As(err, &pm) {
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted:
		return true
	}
	return false
}
