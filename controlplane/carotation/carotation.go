// Package carotation rotates the control plane's CA without re-enrolling
// the fleet (docs/design.md §3.10, docs/adr/0040): a new CA is prepared,
// then activated (it signs from then on), and the old one is retired once
// nothing it signed is live, as SPIRE rotates through prepared, active and
// old keys. The set lives in the store, so every replica agrees on it; the
// new keys are sealed under the data dir's credentials.key, which every
// replica holds already. Each replica installs the set into its pki/ca.CA
// and follows every change.
package carotation

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tetherfleet/tether/controlplane/credentials"
	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/pki"
	"github.com/tetherfleet/tether/pki/ca"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// Service keeps the CA set: in the store, and installed in CA.
type Service struct {
	Store store.Store
	// CA is the authority every service signs and verifies with; Load
	// installs the set into it.
	CA *ca.CA
	// First and FirstKey are the data dir's CA (`tetherd init`): the one
	// whose key is not in the store, and the issuer of the server
	// certificate.
	First    *x509.Certificate
	FirstKey crypto.Signer
	// Sealer seals the keys of prepared CAs (the data dir's
	// credentials.key, the same on every replica).
	Sealer *credentials.Sealer
	Clock  clock.Clock
	Log    *slog.Logger

	mu    sync.Mutex
	view  *view
	chain chainCache
}

// view is what Load derived from the store.
type view struct {
	bundle *tetherv1.TrustBundle
	// firstActive: the data dir's CA signs, and the server certificate
	// is served as it is.
	firstActive bool
	// serverExtra follows the server's leaf once another CA is active:
	// every root not retired, the active first, each with its cross
	// certificate, so a node pinned to any of them verifies the server.
	serverExtra [][]byte
}

var errNoActive = errors.New("no active CA")

// Start records the data dir's CA as the active one when the store has
// no CA set yet (and marks every certificate recorded before as its),
// refuses a data dir whose CA the store's set does not know, and installs
// the set.
func (s *Service) Start(ctx context.Context) error {
	err := s.adopt(ctx)
	if errors.Is(err, store.ErrAlreadyExists) {
		// Another replica starting at the same moment recorded it first.
		err = s.adopt(ctx)
	}
	if err != nil {
		return fmt.Errorf("CA set: %w", err)
	}
	return s.Load(ctx)
}

// adopt records the data dir's CA when the set is empty, and checks that
// it belongs to the set otherwise.
func (s *Service) adopt(ctx context.Context) error {
	now := s.Clock.Now()
	fp := pki.Fingerprint(s.First.Raw)
	return s.Store.Tx(ctx, func(q store.Queries) error {
		all, err := q.ListAuthorities(ctx)
		if err != nil {
			return err
		}
		if len(all) > 0 {
			for _, a := range all {
				if a.Fingerprint == fp {
					return nil
				}
			}
			return fmt.Errorf("the data dir's CA %s is not one of the store's CAs (%s): this data dir belongs to another control plane", fp, fingerprints(all))
		}
		if err := q.CreateAuthority(ctx, &store.Authority{Fingerprint: fp, CertPEM: string(ca.CertPEM(s.First)), State: store.AuthorityActive,
			NotAfter: s.First.NotAfter, CreatedAt: now, UpdatedAt: now}); err != nil {
			return err
		}
		n, err := q.AssignCertificateIssuer(ctx, fp)
		if err != nil {
			return err
		}
		_, err = events.E{Kind: events.CAAdopted, Severity: events.Low,
			Message: fmt.Sprintf("the data dir's CA %s is the active CA of the rotation set (%d certificates recorded before are its)", fp, n),
			Payload: events.CAAdoptedPayload{Certificates: n, Fingerprint: fp}}.Write(ctx, q, now)
		return err
	})
}

func fingerprints(all []*store.Authority) string {
	out := ""
	for i, a := range all {
		if i > 0 {
			out += ", "
		}
		out += a.Fingerprint + " " + a.State
	}
	return out
}

// Load reads the set from the store and installs it: the active CA
// signs, and every CA not retired is trusted (a prepared one too, so a
// replica that has not yet heard of an activation accepts what the
// active one signs).
func (s *Service) Load(ctx context.Context) error {
	all, err := s.Store.ListAuthorities(ctx)
	if err != nil {
		return fmt.Errorf("load the CA set: %w", err)
	}
	var (
		active    *x509.Certificate
		activeKey crypto.Signer
		trusted   []*x509.Certificate
		v         = &view{bundle: &tetherv1.TrustBundle{}}
	)
	for _, a := range all {
		if a.State == store.AuthorityRetired {
			continue
		}
		cert, err := ca.ParseCertificatePEM([]byte(a.CertPEM))
		if err != nil {
			return fmt.Errorf("load the CA set: CA %s: %w", a.Fingerprint, err)
		}
		trusted = append(trusted, cert)
		v.bundle.Roots = append(v.bundle.Roots, &tetherv1.TrustedRoot{CertificatePem: a.CertPEM, CrossPem: a.CrossPEM})
		chain := [][]byte{cert.Raw}
		if a.CrossPEM != "" {
			x, err := ca.ParseCertificatePEM([]byte(a.CrossPEM))
			if err != nil {
				return fmt.Errorf("load the CA set: CA %s: its cross certificate: %w", a.Fingerprint, err)
			}
			chain = append(chain, x.Raw)
		}
		if a.State == store.AuthorityActive {
			v.serverExtra = append(chain, v.serverExtra...)
		} else {
			v.serverExtra = append(v.serverExtra, chain...)
		}
		if a.State == store.AuthorityActive {
			if activeKey, err = s.key(a); err != nil {
				return fmt.Errorf("load the CA set: %w", err)
			}
			active = cert
			v.bundle.ActiveFingerprint = a.Fingerprint
		}
	}
	if active == nil {
		return fmt.Errorf("load the CA set: %w (the store holds %s)", errNoActive, fingerprints(all))
	}
	v.firstActive = active.Equal(s.First)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.CA.Install(active, activeKey, trusted); err != nil {
		return fmt.Errorf("load the CA set: %w", err)
	}
	s.view = v
	return nil
}

// key opens a CA's key: the data dir's for the first CA, else unsealed.
func (s *Service) key(a *store.Authority) (crypto.Signer, error) {
	if len(a.KeySealed) == 0 {
		if a.Fingerprint != pki.Fingerprint(s.First.Raw) {
			return nil, fmt.Errorf("CA %s: its key is in no data dir this replica has (the data dir's CA is %s)", a.Fingerprint, pki.Fingerprint(s.First.Raw))
		}
		return s.FirstKey, nil
	}
	der, err := s.Sealer.Open(sealName(a.Fingerprint), a.KeySealed)
	if err != nil {
		return nil, fmt.Errorf("CA %s: open its key (is this replica's credentials.key the one the others hold?): %w", a.Fingerprint, err)
	}
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, fmt.Errorf("CA %s: parse its key: %w", a.Fingerprint, err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("CA %s: its key cannot sign", a.Fingerprint)
	}
	return signer, nil
}

// sealName binds a sealed key to its CA (the sealer's associated data).
func sealName(fp string) string { return "ca-key/" + fp }

// Bundle is the trust bundle agents receive: every CA not retired, each
// with its cross certificate.
func (s *Service) Bundle() *tetherv1.TrustBundle {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.view == nil {
		return nil
	}
	return s.view.bundle
}

// Follow reloads the set whenever a replica changes it, and every
// interval in case a notification was lost, until ctx ends.
func (s *Service) Follow(ctx context.Context, every time.Duration) {
	ch, stop := s.Store.Subscribe(store.ChannelAuthorities)
	defer stop()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
		case <-t.C:
		}
		if err := s.Load(ctx); err != nil && ctx.Err() == nil {
			s.Log.Error("reloading the CA set failed; the set loaded before stays in use", "err", err)
		}
	}
}

// ServerCertificate wraps the server certificate's source. While the
// data dir's CA is active it serves the data dir's certificate as it is.
// Once another is active, it serves a certificate for the same key and
// names signed by the active CA, followed by every root not retired and
// their cross certificates: a node pinned to the active root verifies it
// directly, one pinned to an older root through the cross certificates
// (pki.ServerRoots), and nothing of a retired CA is presented.
func (s *Service) ServerCertificate(get func(*tls.ClientHelloInfo) (*tls.Certificate, error)) func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
		base, err := get(hello)
		if err != nil || base == nil {
			return base, err
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.view == nil || s.view.firstActive {
			return base, nil
		}
		if s.chain.base == base && s.chain.view == s.view {
			return s.chain.out, nil
		}
		leaf := base.Leaf
		if leaf == nil {
			if leaf, err = x509.ParseCertificate(base.Certificate[0]); err != nil {
				return nil, fmt.Errorf("server certificate: %w", err)
			}
		}
		re, err := s.CA.ReissueServer(leaf)
		if err != nil {
			return nil, fmt.Errorf("server certificate under the active CA: %w", err)
		}
		out := *base
		out.Leaf = re
		out.Certificate = append([][]byte{re.Raw}, s.view.serverExtra...)
		s.chain = chainCache{base: base, view: s.view, out: &out}
		return &out, nil
	}
}

// chainCache keeps the last reissued certificate, so a handshake does
// not sign one.
type chainCache struct {
	base *tls.Certificate
	view *view
	out  *tls.Certificate
}
