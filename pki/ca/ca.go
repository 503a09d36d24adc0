// Package ca is the control plane's certificate authority. It keeps the CA
// key and signs node, admin and server certificates. Node certificates are
// built from scratch (never from what the CSR asks for), checked against
// smallstep's X.509 name policy engine (only tether://instance/...
// identities) and signed with crypto/x509 (docs/adr/0011).
//
// The agent must never import this package.
package ca

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha1"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/smallstep/certificates/authority/policy"
	"go.step.sm/crypto/x509util"

	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/pki"
)

// Defaults.
const (
	DefaultNodeLifetime  = 24 * time.Hour
	MaxNodeLifetime      = 7 * 24 * time.Hour
	DefaultAdminLifetime = 90 * 24 * time.Hour
	ServerLifetime       = 5 * 365 * 24 * time.Hour
	caLifetime           = 10 * 365 * 24 * time.Hour
	// backdate absorbs clock skew between the control plane and nodes.
	backdate = time.Minute
)

// File names inside the CA directory.
const (
	CertFile = "ca.crt"
	KeyFile  = "ca.key"
)

// ErrExists is returned by Create when a CA is already there.
var ErrExists = errors.New("a CA already exists")

// CA signs certificates. During a rotation (controlplane/carotation) it
// holds several roots: it signs with the active one and verifies client
// certificates against all of them; Install swaps the set atomically.
type CA struct {
	cur atomic.Pointer[roster]
	// changed is closed and replaced by each Install.
	changedMu sync.Mutex
	changed   chan struct{}
	// policy refuses any name outside tether://instance/..., whatever
	// builds the certificate.
	policy *policy.Engine
	clock  clock.Clock
	// signed counts node certificates, to pick which signatures
	// createCertificate checks.
	signed atomic.Uint64
}

// roster is one consistent view of the CA set: the signer and every
// root trusted for client certificates.
type roster struct {
	cert  *x509.Certificate
	key   crypto.Signer
	roots []*x509.Certificate
	pool  *x509.CertPool
}

func newRoster(cert *x509.Certificate, key crypto.Signer, trusted []*x509.Certificate) *roster {
	r := &roster{cert: cert, key: key, pool: x509.NewCertPool()}
	r.roots = append(r.roots, cert)
	r.pool.AddCert(cert)
	for _, t := range trusted {
		if t.Equal(cert) {
			continue
		}
		r.roots = append(r.roots, t)
		r.pool.AddCert(t)
	}
	return r
}

// KeyType is the CA key's algorithm.
type KeyType string

// CA key types. P-256 is the default: every TLS stack and openssl take it.
// Ed25519 signs and verifies faster (docs/benchmarks.md) and Go, the
// agent and grpcurl accept it; older TLS stacks may not.
const (
	KeyP256    KeyType = "p256"
	KeyEd25519 KeyType = "ed25519"
)

// ParseKeyType reads a --ca-key value ("" is the default, P-256).
func ParseKeyType(s string) (KeyType, error) {
	switch KeyType(s) {
	case "", KeyP256:
		return KeyP256, nil
	case KeyEd25519:
		return KeyEd25519, nil
	}
	return "", fmt.Errorf("CA key type %q: want %s or %s", s, KeyP256, KeyEd25519)
}

func newKey(kt KeyType) (crypto.Signer, error) {
	switch kt {
	case "", KeyP256:
		return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case KeyEd25519:
		_, k, err := ed25519.GenerateKey(rand.Reader)
		return k, err
	}
	return nil, fmt.Errorf("CA key type %q: want %s or %s", kt, KeyP256, KeyEd25519)
}

// Create makes a new CA with a P-256 key in dir and refuses to overwrite one.
func Create(dir, name string, clock clock.Clock) (*CA, error) {
	return CreateWithKey(dir, name, clock, KeyP256)
}

// CreateWithKey makes a new CA whose key is of type kt.
func CreateWithKey(dir, name string, clock clock.Clock, kt KeyType) (*CA, error) {
	certPath, keyPath := filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile)
	for _, p := range []string{certPath, keyPath} {
		if _, err := os.Stat(p); err == nil {
			return nil, fmt.Errorf("%s: %w (refusing to overwrite it)", p, ErrExists)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create CA dir: %w", err)
	}
	cert, key, err := GenerateRoot(name, kt, clock.Now())
	if err != nil {
		return nil, err
	}
	der := cert.Raw
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode CA key: %w", err)
	}
	// Key first, exclusively: a crash leaves a key without a certificate,
	// which Create refuses to overwrite rather than silently replacing.
	if err := WriteFileExclusive(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return nil, err
	}
	if err := WriteFileExclusive(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return nil, err
	}
	return Load(dir, clock)
}

// Load opens the CA in dir.
func Load(dir string, clock clock.Clock) (*CA, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, CertFile))
	if err != nil {
		return nil, fmt.Errorf("load CA certificate: %w", err)
	}
	cert, err := ParseCertificatePEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("load CA certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, KeyFile))
	if err != nil {
		return nil, fmt.Errorf("load CA key: %w", err)
	}
	block, _ := pem.Decode(keyPEM)
	if block == nil {
		return nil, errors.New("load CA key: no PEM block")
	}
	parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("load CA key: %w", err)
	}
	key, ok := parsed.(crypto.Signer)
	if !ok {
		return nil, errors.New("load CA key: not a signing key")
	}
	return New(cert, key, clock)
}

// New builds a CA from a certificate and key (tests use it directly).
func New(cert *x509.Certificate, key crypto.Signer, clock clock.Clock) (*CA, error) {
	engine, err := policy.New(&policy.Options{X509: &policy.X509PolicyOptions{
		AllowedNames: &policy.X509NameOptions{URIDomains: []string{pki.KindInstance}},
	}})
	if err != nil {
		return nil, fmt.Errorf("node name policy: %w", err)
	}
	c := &CA{policy: engine, clock: clock, changed: make(chan struct{})}
	c.cur.Store(newRoster(cert, key, nil))
	return c, nil
}

// Install makes cert and key the signer and trusts client certificates
// from every root in trusted as well (the active one is always trusted).
// Signatures in flight finish with the set they started with.
func (c *CA) Install(cert *x509.Certificate, key crypto.Signer, trusted []*x509.Certificate) error {
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return fmt.Errorf("install CA %s: not a CA certificate", pki.Fingerprint(cert.Raw))
	}
	if !publicKeyEqual(cert.PublicKey, key.Public()) {
		return fmt.Errorf("install CA %s: the key is not the certificate's", pki.Fingerprint(cert.Raw))
	}
	c.cur.Store(newRoster(cert, key, trusted))
	c.changedMu.Lock()
	close(c.changed)
	c.changed = make(chan struct{})
	c.changedMu.Unlock()
	return nil
}

// Changed is closed at the next Install.
func (c *CA) Changed() <-chan struct{} {
	c.changedMu.Lock()
	defer c.changedMu.Unlock()
	return c.changed
}

func publicKeyEqual(a, b crypto.PublicKey) bool {
	k, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && k.Equal(b)
}

// Certificate is the active CA certificate: the one that signs.
func (c *CA) Certificate() *x509.Certificate { return c.cur.Load().cert }

// Roots are every root trusted for client certificates, the active first.
func (c *CA) Roots() []*x509.Certificate { return slices.Clone(c.cur.Load().roots) }

// Pool holds every trusted root, for verifying peers.
func (c *CA) Pool() *x509.CertPool { return c.cur.Load().pool }

// Fingerprint is the pinned form of the active CA that agents receive.
func (c *CA) Fingerprint() string { return pki.Fingerprint(c.Certificate().Raw) }

// CertificatePEM is the active CA certificate in PEM.
func (c *CA) CertificatePEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate().Raw})
}

// IssuerOf is the trusted root that issued cert, matched by its
// authority key id (no signature check: the caller signed it or verified
// it), or the active root when none matches.
func (c *CA) IssuerOf(cert *x509.Certificate) *x509.Certificate {
	r := c.cur.Load()
	for _, root := range r.roots {
		if len(cert.AuthorityKeyId) > 0 && bytes.Equal(cert.AuthorityKeyId, root.SubjectKeyId) {
			return root
		}
	}
	return r.cert
}

// SignNode signs a node certificate for instanceID. The CSR must carry an
// Ed25519 key, a valid self-signature, and name nothing but the instance.
// The certificate takes only the CSR's key: its one name (a URI SAN, no
// subject), its lifetime (on the injected clock) and its usage (client
// authentication only) are set here, and the name policy checks the result
// before the CA signs it.
func (c *CA) SignNode(_ context.Context, csr *x509.CertificateRequest, instanceID string, lifetime time.Duration) (*x509.Certificate, error) {
	if err := CheckNodeCSR(csr, instanceID); err != nil {
		return nil, err
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("CSR signature: %w", err)
	}
	if lifetime <= 0 {
		lifetime = DefaultNodeLifetime
	}
	if lifetime > MaxNodeLifetime {
		return nil, fmt.Errorf("requested lifetime %s exceeds the maximum %s", lifetime, MaxNodeLifetime)
	}
	now := c.clock.Now()
	pub, err := x509.MarshalPKIXPublicKey(csr.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("sign node certificate: %w", err)
	}
	ski := sha1.Sum(pub) // RFC 5280's method 1 would hash only the key bits; any stable id will do
	tpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		URIs:         []*url.URL{pki.InstanceURI(instanceID)},
		NotBefore:    now.Add(-backdate),
		NotAfter:     now.Add(lifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		SubjectKeyId: ski[:],
	}
	r := c.cur.Load()
	if tpl.NotAfter.After(r.cert.NotAfter) {
		tpl.NotAfter = r.cert.NotAfter
	}
	if err := c.policy.IsX509CertificateAllowed(tpl); err != nil {
		return nil, fmt.Errorf("sign node certificate: %w", err)
	}
	cert, err := c.createCertificate(r, tpl, csr.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("sign node certificate: %w", err)
	}
	return cert, nil
}

// CSR errors, phrased for the operator reading the agent's console.
var (
	ErrCSRKeyType = errors.New("CSR key must be Ed25519")
	ErrCSRNames   = errors.New("CSR may name only its own instance")
)

// CheckNodeCSR enforces what a node may ask for: an Ed25519 key and no
// names other than tether://instance/<id>. It does not verify the CSR's
// self-signature: SignNode does, once, after these cheaper checks.
func CheckNodeCSR(csr *x509.CertificateRequest, instanceID string) error {
	if _, ok := csr.PublicKey.(ed25519.PublicKey); !ok {
		return fmt.Errorf("%w, got %s", ErrCSRKeyType, csr.PublicKeyAlgorithm)
	}
	if len(csr.DNSNames) > 0 || len(csr.IPAddresses) > 0 || len(csr.EmailAddresses) > 0 {
		return fmt.Errorf("%w: it asks for DNS/IP/email names", ErrCSRNames)
	}
	want := pki.InstanceURI(instanceID).String()
	for _, u := range csr.URIs {
		if u.String() != want {
			return fmt.Errorf("%w: it asks for %q", ErrCSRNames, u.String())
		}
	}
	if cn := csr.Subject.CommonName; cn != "" && cn != instanceID {
		return fmt.Errorf("%w: its common name is %q", ErrCSRNames, cn)
	}
	return nil
}

// ParseCSR decodes a PEM (or DER) certificate request. It does not check
// the signature; SignNode does.
func ParseCSR(data []byte) (*x509.CertificateRequest, error) {
	if block, _ := pem.Decode(data); block != nil {
		if block.Type != "CERTIFICATE REQUEST" && block.Type != "NEW CERTIFICATE REQUEST" {
			return nil, fmt.Errorf("PEM block is %q, want CERTIFICATE REQUEST", block.Type)
		}
		data = block.Bytes
	}
	csr, err := x509.ParseCertificateRequest(data)
	if err != nil {
		return nil, fmt.Errorf("parse CSR: %w", err)
	}
	return csr, nil
}

// SignAdmin issues an admin client certificate for a key.
func (c *CA) SignAdmin(name, role string, pub crypto.PublicKey, lifetime time.Duration) (*x509.Certificate, error) {
	if lifetime <= 0 {
		lifetime = DefaultAdminLifetime
	}
	id := pki.Identity{Kind: pki.KindAdmin, Name: name, Role: role}
	return c.signDirect(&x509.Certificate{
		Subject:     pkix.Name{CommonName: name, OrganizationalUnit: []string{role}},
		URIs:        []*url.URL{id.URI()},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, pub, lifetime)
}

// SignServer issues the control plane's TLS server certificate for the
// given host names and addresses.
func (c *CA) SignServer(hosts []string, pub crypto.PublicKey) (*x509.Certificate, error) {
	tpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "tetherd"},
		URIs:        []*url.URL{pki.Identity{Kind: pki.KindServer, Name: "tetherd"}.URI()},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tpl.IPAddresses = append(tpl.IPAddresses, ip)
		} else {
			tpl.DNSNames = append(tpl.DNSNames, h)
		}
	}
	return c.signDirect(tpl, pub, ServerLifetime)
}

// signDirect signs certificates the control plane makes for itself at init
// (server, admin) through x509util, outside the node name policy.
func (c *CA) signDirect(tpl *x509.Certificate, pub crypto.PublicKey, lifetime time.Duration) (*x509.Certificate, error) {
	now := c.clock.Now()
	tpl.SerialNumber = randomSerial()
	tpl.NotBefore, tpl.NotAfter = now.Add(-backdate), now.Add(lifetime)
	r := c.cur.Load()
	if tpl.NotAfter.After(r.cert.NotAfter) {
		tpl.NotAfter = r.cert.NotAfter
	}
	cert, err := x509util.CreateCertificate(tpl, r.cert, pub, r.key)
	if err != nil {
		return nil, fmt.Errorf("sign certificate for %s: %w", tpl.Subject.CommonName, err)
	}
	return cert, nil
}

// Verify checks a peer certificate against the CA at the clock's time and
// returns its identity. It does not check revocation.
func (c *CA) Verify(cert *x509.Certificate, usage x509.ExtKeyUsage) (pki.Identity, error) {
	if _, err := cert.Verify(x509.VerifyOptions{Roots: c.Pool(), CurrentTime: c.clock.Now(), KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		var inv x509.CertificateInvalidError
		if errors.As(err, &inv) && inv.Reason == x509.Expired {
			return pki.Identity{}, fmt.Errorf("certificate %s expired at %s", SerialString(cert), cert.NotAfter.UTC().Format(time.RFC3339))
		}
		return pki.Identity{}, fmt.Errorf("certificate %s: %w", SerialString(cert), err)
	}
	return pki.IdentityOf(cert)
}

// SerialString is how serials are stored and shown: lowercase hex.
func SerialString(cert *x509.Certificate) string { return fmt.Sprintf("%x", cert.SerialNumber) }

func randomSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	return n
}

// GenerateRoot makes a new self-signed root in memory (a CA rotation's
// prepared key; controlplane/carotation stores it). Like the first CA it
// signs leaves only.
func GenerateRoot(name string, kt KeyType, now time.Time) (*x509.Certificate, crypto.Signer, error) {
	key, err := newKey(kt)
	if err != nil {
		return nil, nil, fmt.Errorf("generate CA key: %w", err)
	}
	tpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"Tether"}},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(caLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("self-sign CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("parse the new CA: %w", err)
	}
	return cert, key, nil
}

// CrossSign issues a certificate for subject's name and key, signed by
// issuer: the same CA seen from another root. It is valid no longer than
// either and allows no further intermediate below it.
func CrossSign(issuer *x509.Certificate, issuerKey crypto.Signer, subject *x509.Certificate, now time.Time) (*x509.Certificate, error) {
	notAfter := subject.NotAfter
	if issuer.NotAfter.Before(notAfter) {
		notAfter = issuer.NotAfter
	}
	tpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               subject.Subject,
		SubjectKeyId:          subject.SubjectKeyId,
		NotBefore:             now.Add(-backdate),
		NotAfter:              notAfter,
		KeyUsage:              subject.KeyUsage,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, issuer, subject.PublicKey, issuerKey)
	if err != nil {
		return nil, fmt.Errorf("cross-sign %s with %s: %w", pki.Fingerprint(subject.Raw), pki.Fingerprint(issuer.Raw), err)
	}
	return x509.ParseCertificate(der)
}

// Key is the active CA's signing key, for the rotation that cross-signs
// a prepared root with it.
func (c *CA) Key() crypto.Signer { return c.cur.Load().key }

// ReissueServer signs, with the active CA, a server certificate for the
// same key and names as leaf (the data dir's server certificate), ending
// no later than leaf: after a rotation's activate, every replica serves
// one, so a node pinned to the new CA verifies the server without any
// certificate of the old one.
func (c *CA) ReissueServer(leaf *x509.Certificate) (*x509.Certificate, error) {
	tpl := &x509.Certificate{
		Subject:     leaf.Subject,
		URIs:        leaf.URIs,
		DNSNames:    leaf.DNSNames,
		IPAddresses: leaf.IPAddresses,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	cert, err := c.signDirect(tpl, leaf.PublicKey, leaf.NotAfter.Sub(c.clock.Now()))
	if err != nil {
		return nil, err
	}
	return cert, nil
}
