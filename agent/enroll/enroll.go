// Package enroll gives the node its identity: an Ed25519 key generated in
// memory, a certificate obtained by trading a one-time bootstrap token for
// it (EnrollmentService.Enroll, over TLS pinned to the CA fingerprint), and
// renewal at two thirds of the certificate's lifetime with a fresh key over
// mTLS (AgentService.Renew). Key, certificate and CA are kept in the state
// directory so the agent that runs after the switch of root reuses them.
package enroll

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"

	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/pki"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// Identity is a key with the certificate issued for it.
type Identity struct {
	InstanceID string
	Key        ed25519.PrivateKey
	Cert       *x509.Certificate
	CA         *x509.Certificate
	// TLS is ready to hand to a TLS client.
	TLS *tls.Certificate
}

func newIdentity(key ed25519.PrivateKey, cert, ca *x509.Certificate) (*Identity, error) {
	pub, ok := cert.PublicKey.(ed25519.PublicKey)
	if !ok || !pub.Equal(key.Public()) {
		return nil, errors.New("certificate is not for this key")
	}
	who, err := pki.IdentityOf(cert)
	if err != nil {
		return nil, err
	}
	if who.Kind != pki.KindInstance {
		return nil, fmt.Errorf("certificate names a %s, not an instance", who.Kind)
	}
	return &Identity{
		InstanceID: who.Name,
		Key:        key,
		Cert:       cert,
		CA:         ca,
		TLS:        &tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert},
	}, nil
}

// RenewAt is when the certificate should be renewed: two thirds into its
// lifetime, leaving a third of it to ride out a control plane outage.
func (id *Identity) RenewAt() time.Time {
	life := id.Cert.NotAfter.Sub(id.Cert.NotBefore)
	return id.Cert.NotBefore.Add(life * 2 / 3)
}

// Expired reports whether the certificate is no longer valid at now.
func (id *Identity) Expired(now time.Time) bool { return !now.Before(id.Cert.NotAfter) }

// Config configures a Manager.
type Config struct {
	// StateDir holds key, certificate, CA and identity.json.
	StateDir string
	// URL is the control plane, https://HOST:PORT, or several separated
	// by commas: connections go to the first that answers (Failover).
	URL string
	// CAFingerprint is the pinned CA, "sha256:<hex>".
	CAFingerprint string
	Clock         clock.Clock
	// DialOptions are added to every connection (tests inject a dialer).
	DialOptions []grpc.DialOption
	// Logf prints a console line.
	Logf func(format string, args ...any)
	// Delay is the wait before retry attempt n (from 0); default full
	// jitter between 0 and min(30 s, 500 ms·2^n).
	Delay func(attempt int) time.Duration
}

// Manager holds the node's current identity and keeps it valid.
type Manager struct {
	cfg    Config
	store  store
	pin    *Pin
	target string
	// failover is set when the URL names several control planes.
	failover *Failover

	current atomic.Pointer[Identity]
	// renewMu serialises enrollments and renewals.
	renewMu sync.Mutex
	subs    subscribers
	// pending is the key of an enrollment not yet answered (under
	// renewMu): a retry with the same token sends the same CSR, so that an
	// enrollment whose answer was lost after the control plane spent the
	// token is answered again instead of refused as a replay.
	pending *pendingEnrollment
}

type pendingEnrollment struct {
	token string
	key   ed25519.PrivateKey
	csr   string
}

// New checks the configuration; it does no I/O.
func New(cfg Config) (*Manager, error) {
	if cfg.StateDir == "" {
		return nil, errors.New("enroll: empty state dir")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.Delay == nil {
		cfg.Delay = defaultDelay
	}
	eps, err := SplitURLs(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("enroll: %w", err)
	}
	pin, err := NewPin(cfg.CAFingerprint, eps[0].Host, cfg.Clock.Now)
	if err != nil {
		return nil, fmt.Errorf("enroll: %w", err)
	}
	m := &Manager{
		cfg:    cfg,
		store:  store{Dir: cfg.StateDir},
		pin:    pin,
		target: eps[0].Target,
	}
	if len(eps) > 1 {
		m.failover = &Failover{Endpoints: eps, Clock: cfg.Clock, Logf: cfg.Logf}
	}
	return m, nil
}

func defaultDelay(n int) time.Duration {
	ceil := 500 * time.Millisecond << min(n, 6)
	return time.Duration(mrand.Int64N(int64(min(ceil, 30*time.Second)) + 1))
}

// SplitURL turns https://HOST:PORT into a dial target (HOST:PORT, port 443
// when absent) and the host name the server certificate must carry.
func SplitURL(raw string) (target, host string, err error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "https" || u.Hostname() == "" {
		return "", "", fmt.Errorf("control plane URL %q: want https://HOST:PORT", raw)
	}
	port := u.Port()
	if port == "" {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port), u.Hostname(), nil
}

// Pin is the pinned-CA verifier the Manager's connections use.
func (m *Manager) Pin() *Pin { return m.pin }

// Current returns the identity in use, or nil before enrollment.
func (m *Manager) Current() *Identity { return m.current.Load() }

// TLSConfig is the mTLS client configuration: pinned server verification
// and the current certificate, read at every handshake.
func (m *Manager) TLSConfig() *tls.Config {
	return m.pin.TLSConfig(func() *tls.Certificate {
		if id := m.current.Load(); id != nil {
			return id.TLS
		}
		return nil
	})
}

// Dial opens a (lazy) connection to the control plane. With clientCert the
// connection presents the node certificate (AgentService); without it,
// only the server is verified (EnrollmentService).
func (m *Manager) Dial(clientCert bool) (*grpc.ClientConn, error) {
	cfg := m.pin.TLSConfig(nil)
	if clientCert {
		cfg = m.TLSConfig()
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(cfg)),
		// tls.Conn buffers what it reads already; gRPC's 32 KiB read buffer
		// in front of it would only copy every module byte once more.
		grpc.WithReadBufferSize(0),
		// gRPC's own redial back-off would grow to 120 s while the session
		// retries every few seconds and fails fast; capped like the
		// session's (30 s) an agent is never parked longer than its own
		// back-off says after a long outage.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: redialBackoff, MinConnectTimeout: 20 * time.Second}),
	}
	if m.failover != nil {
		// Several control planes: each connection goes to the first that
		// answers, and its handshake checks that one's name.
		opts = append(opts, grpc.WithTransportCredentials(m.failover.Credentials(cfg, m.pin)), grpc.WithContextDialer(m.failover.DialContext))
	}
	opts = append(opts, m.cfg.DialOptions...)
	// passthrough: the target is HOST:PORT handed to the dialer as is; an
	// initramfs has no resolv.conf for grpc's DNS resolver to read.
	conn, err := grpc.NewClient("passthrough:///"+m.target, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", m.target, err)
	}
	return conn, nil
}

// redialBackoff is gRPC's default schedule with the session's cap.
var redialBackoff = backoff.Config{BaseDelay: time.Second, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 30 * time.Second}

// Load restores the identity saved in the state directory. It returns
// ErrNoIdentity when there is none. A saved identity for another control
// plane or CA is not used.
func (m *Manager) Load() (*Identity, error) {
	id, meta, err := m.store.load()
	if err != nil {
		return nil, err
	}
	if meta.CAFingerprint != m.pin.Fingerprint() {
		return nil, fmt.Errorf("saved identity was issued under CA %s, but the pin is %s: %w", meta.CAFingerprint, m.pin.Fingerprint(), ErrNoIdentity)
	}
	// The roots learnt before (a rotation's bundle), checked again
	// against the pin: the state dir holds nothing the pin must take on
	// trust.
	if entries, trusted, err := m.store.loadBundle(); err != nil {
		m.cfg.Logf("enroll: the saved trust bundle is unreadable, only the pinned CA is trusted until the control plane sends it again: %v", err)
	} else {
		m.pin.Restore(entries, trusted)
	}
	if err := m.pin.SetKnownCA(id.CA); err != nil {
		return nil, err
	}
	m.set(id)
	return id, nil
}

// TokenSpent reports whether this node has already enrolled with token.
func (m *Manager) TokenSpent(token string) bool {
	meta := m.savedMeta("token check")
	return slices.Contains(meta.SpentTokenHashes, pki.HashToken(token))
}

// savedMeta reads the saved identity metadata. None saved is a first
// enrollment. A file that cannot be read or parsed cannot say which tokens
// were spent: that is said on the console, the file is kept beside as
// identity.json.corrupt for a look, and the caller carries on with an
// empty record rather than fail an enrollment the control plane granted.
func (m *Manager) savedMeta(during string) savedMeta {
	meta, err := m.store.loadMeta()
	switch {
	case err == nil:
		return meta
	case errors.Is(err, ErrNoIdentity):
		return savedMeta{}
	}
	kept := m.store.keepCorrupt()
	m.cfg.Logf("enroll: %s: saved identity metadata unreadable, its record of spent bootstrap tokens is lost (%s): %v", during, kept, err)
	return savedMeta{}
}

func (m *Manager) set(id *Identity) {
	m.current.Store(id)
	m.notify()
}

// newKeyAndCSR generates a fresh key and a CSR for it. The CSR names
// nothing: the control plane decides the certificate's identity from the
// token (or, on renewal, from the certificate presented), never from what
// the node asks for.
func newKeyAndCSR() (ed25519.PrivateKey, string, error) {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, "", fmt.Errorf("generate key: %w", err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return nil, "", fmt.Errorf("create csr: %w", err)
	}
	return key, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})), nil
}

// Enroll trades a bootstrap token for a certificate. client must be on a
// connection from Dial(false).
func (m *Manager) Enroll(ctx context.Context, client tetherv1.EnrollmentServiceClient, token string) (*Identity, error) {
	m.renewMu.Lock()
	defer m.renewMu.Unlock()
	if m.pending == nil || m.pending.token != token {
		key, csr, err := newKeyAndCSR()
		if err != nil {
			return nil, fmt.Errorf("enroll: %w", err)
		}
		m.pending = &pendingEnrollment{token: token, key: key, csr: csr}
	}
	key, csr := m.pending.key, m.pending.csr
	m.pin.TakeMismatch()
	resp, err := client.Enroll(ctx, &tetherv1.EnrollRequest{Token: token, CsrPem: csr})
	if err != nil {
		return nil, m.rpcError("enroll", err)
	}
	m.ApplyBundle(resp.GetTrustBundle())
	id, err := m.accept(key, resp.GetCertificatePem(), resp.GetCaPem(), "")
	if err != nil {
		return nil, fmt.Errorf("enroll: %w", err)
	}
	if resp.GetInstanceId() != "" && resp.GetInstanceId() != id.InstanceID {
		return nil, fmt.Errorf("enroll: response says instance %q but the certificate names %q", resp.GetInstanceId(), id.InstanceID)
	}
	meta := m.savedMeta("enroll")
	meta.SpentTokenHashes = append(meta.SpentTokenHashes, pki.HashToken(token))
	if err := m.commit(id, meta); err != nil {
		return nil, fmt.Errorf("enroll: %w", err)
	}
	m.pending = nil
	return id, nil
}

// Renew replaces the certificate with one for a fresh key, over mTLS with
// the current certificate. client must be on a connection from Dial(true).
func (m *Manager) Renew(ctx context.Context, client tetherv1.AgentServiceClient) (*Identity, error) {
	m.renewMu.Lock()
	defer m.renewMu.Unlock()
	cur := m.current.Load()
	if cur == nil {
		return nil, errors.New("renew: not enrolled")
	}
	key, csr, err := newKeyAndCSR()
	if err != nil {
		return nil, fmt.Errorf("renew: %w", err)
	}
	m.pin.TakeMismatch()
	resp, err := client.Renew(ctx, &tetherv1.RenewRequest{CsrPem: csr})
	if err != nil {
		return nil, m.rpcError("renew", err)
	}
	m.ApplyBundle(resp.GetTrustBundle())
	id, err := m.accept(key, resp.GetCertificatePem(), resp.GetCaPem(), cur.InstanceID)
	if err != nil {
		return nil, fmt.Errorf("renew: %w", err)
	}
	meta := m.savedMeta("renew")
	if err := m.commit(id, meta); err != nil {
		return nil, fmt.Errorf("renew: %w", err)
	}
	return id, nil
}

// rpcError prefers the pin mismatch, which gRPC would otherwise bury in an
// Unavailable status string.
func (m *Manager) rpcError(op string, err error) error {
	if pm := m.pin.TakeMismatch(); pm != nil {
		return fmt.Errorf("%s: %w", op, pm)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// accept checks an issued certificate before anything is stored: it must be
// for our key, chain to the pinned CA, be valid now, and (on renewal) name
// the same instance.
func (m *Manager) accept(key ed25519.PrivateKey, certPEM, caPEM, wantInstance string) (*Identity, error) {
	cert, err := parseCertPEM([]byte(certPEM))
	if err != nil {
		return nil, fmt.Errorf("certificate in response: %w", err)
	}
	var caCert *x509.Certificate
	switch cur := m.Current(); {
	case caPEM != "":
		if caCert, err = parseCertPEM([]byte(caPEM)); err != nil {
			return nil, fmt.Errorf("CA in response: %w", err)
		}
	case cur != nil:
		caCert = cur.CA
	default:
		return nil, errors.New("response carries no CA certificate")
	}
	if !m.pin.Trusts(pki.Fingerprint(caCert.Raw)) {
		return nil, fmt.Errorf("response's CA has fingerprint %s, neither the pinned %s nor a root chained to it", pki.Fingerprint(caCert.Raw), m.pin.Fingerprint())
	}
	roots := x509.NewCertPool()
	roots.AddCert(caCert)
	if _, err := cert.Verify(x509.VerifyOptions{
		Roots:       roots,
		CurrentTime: m.cfg.Clock.Now(),
		KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return nil, fmt.Errorf("issued certificate does not verify against the pinned CA: %w", err)
	}
	id, err := newIdentity(key, cert, caCert)
	if err != nil {
		return nil, fmt.Errorf("issued certificate: %w", err)
	}
	if wantInstance != "" && id.InstanceID != wantInstance {
		return nil, fmt.Errorf("renewed certificate names instance %q, want %q", id.InstanceID, wantInstance)
	}
	return id, nil
}

// commit stores the identity and then makes it current: nothing uses a
// certificate that would be lost on a restart.
func (m *Manager) commit(id *Identity, meta savedMeta) error {
	meta.InstanceID = id.InstanceID
	meta.URL = m.cfg.URL
	meta.CAFingerprint = m.pin.Fingerprint()
	meta.NotAfter = id.Cert.NotAfter
	if err := m.store.save(id, meta); err != nil {
		return fmt.Errorf("save identity: %w", err)
	}
	if err := m.pin.SetKnownCA(id.CA); err != nil {
		return err
	}
	m.set(id)
	return nil
}

// ApplyBundle trusts the roots of a trust bundle (design §3.10) that chain
// to the pin, saves them for the agent after the switch of root, and
// says on the console what it learnt and what it refused. The control
// plane sends one on every stream and in every enrollment and renewal
// answer; nil (a control plane from before rotation) changes nothing.
func (m *Manager) ApplyBundle(b *tetherv1.TrustBundle) {
	if b == nil {
		return
	}
	var roots []pki.BundleRoot
	for _, r := range b.GetRoots() {
		root, err := parseCertPEM([]byte(r.GetCertificatePem()))
		if err != nil {
			m.cfg.Logf("trust bundle: a root that does not parse is ignored: %v", err)
			continue
		}
		br := pki.BundleRoot{Root: root}
		if r.GetCrossPem() != "" {
			if br.Cross, err = parseCertPEM([]byte(r.GetCrossPem())); err != nil {
				m.cfg.Logf("trust bundle: root %s: its cross certificate does not parse: %v", pki.Fingerprint(root.Raw), err)
			}
		}
		roots = append(roots, br)
	}
	_, before := m.pin.Bundle()
	added := m.trust(roots)
	entries, now := m.pin.Bundle()
	if slices.Equal(before, now) {
		return
	}
	if err := m.store.saveBundle(entries, now); err != nil {
		m.cfg.Logf("trust bundle: saving it failed (the agent after the switch of root learns it again from its stream): %v", err)
	}
	if len(added) > 0 {
		m.cfg.Logf("trust bundle: now trusting CA %s (chained to the pinned %s); renewals are signed by %s",
			strings.Join(added, ", "), m.pin.Fingerprint(), b.GetActiveFingerprint())
	}
	for _, fp := range before {
		if !slices.Contains(now, fp) {
			m.cfg.Logf("trust bundle: CA %s was retired; it is trusted no more", fp)
		}
	}
}

// trust adds roots to the pin, saying on the console why any is refused.
func (m *Manager) trust(roots []pki.BundleRoot) []string {
	added, refused := m.pin.Trust(roots)
	for _, err := range refused {
		if errors.Is(err, pki.ErrNoCross) {
			continue
		}
		m.cfg.Logf("trust bundle: refused (it does not chain to the pinned CA %s): %v", m.pin.Fingerprint(), err)
	}
	return added
}
