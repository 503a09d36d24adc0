// Package enroll turns one-time bootstrap tokens and CSRs into node
// certificates (docs/design.md §3), and renews them over mTLS.
package enroll

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/pki"
	"github.com/tetherfleet/tether/pki/ca"
)

// MaxCSRBytes bounds what Enroll will parse.
const MaxCSRBytes = 8 << 10

// Clock is the time source.
type Clock interface{ Now() time.Time }

// Service issues node certificates.
type Service struct {
	Store    store.Store
	CA       *ca.CA
	Clock    Clock
	Log      *slog.Logger
	Lifetime time.Duration // zero: ca.DefaultNodeLifetime
}

// Issued is a signed certificate and whom it names.
type Issued struct {
	InstanceID string
	Cert       *x509.Certificate
}

// errRefused is the one answer for an unknown, expired, spent or
// terminated token: which of them it was is for the audit log, not for
// whoever is holding the token.
var errRefused = fail.Unauthenticated("bootstrap token refused: it is unknown, expired or already used; ask the operator for a fresh one (tetherctl token create --instance ID)")

// Enroll checks the token, signs the CSR and, in one transaction, spends the
// token and records the certificate.
func (s *Service) Enroll(ctx context.Context, token, csrPEM string) (*Issued, error) {
	if token == "" {
		return nil, fail.Invalid("token", "required")
	}
	if csrPEM == "" {
		return nil, fail.Invalid("csr_pem", "required")
	}
	if len(csrPEM) > MaxCSRBytes {
		return nil, fail.Invalid("csr_pem", "%d bytes is more than the %d a CSR needs", len(csrPEM), MaxCSRBytes)
	}
	csr, err := ca.ParseCSR([]byte(csrPEM))
	if err != nil {
		return nil, fail.Invalid("csr_pem", "%v", err)
	}
	hash, err := pki.ParseToken(token)
	if err != nil {
		return nil, errRefused
	}
	now := s.Clock.Now()

	// A read first, so that a bad token or a bad CSR costs no signature and
	// changes nothing. The transaction below re-checks authoritatively.
	tok, err := s.Store.GetToken(ctx, hash)
	if errors.Is(err, store.ErrNotFound) {
		s.Log.Warn("enrollment refused: unknown token")
		return nil, errRefused
	}
	if err != nil {
		return nil, err
	}
	if tok.UsedAt != nil {
		s.reused(ctx, tok, now)
		return nil, errRefused
	}
	if !tok.ExpiresAt.After(now) {
		s.refused(ctx, tok.InstanceID, now, "token expired at "+tok.ExpiresAt.Format(time.RFC3339))
		return nil, errRefused
	}
	inst, err := s.Store.GetInstance(ctx, tok.InstanceID)
	if errors.Is(err, store.ErrNotFound) || (err == nil && inst.Status == "terminated") {
		s.refused(ctx, tok.InstanceID, now, "instance is terminated or gone")
		return nil, errRefused
	}
	if err != nil {
		return nil, err
	}
	// SignNode checks the policy and the CSR's signature before anything is
	// spent; a refusal here leaves the token usable.
	cert, err := s.CA.SignNode(ctx, csr, inst.ID, s.Lifetime)
	if err != nil {
		return nil, fail.Invalid("csr_pem", "%v", err)
	}
	err = s.Store.Tx(ctx, func(q store.Queries) error {
		if _, err := q.ConsumeToken(ctx, hash, now); err != nil {
			return err
		}
		if err := q.CreateCertificate(ctx, record(cert, inst.ID, now)); err != nil {
			return err
		}
		_, err := events.E{Kind: events.EnrollSucceeded, InstanceID: inst.ID,
			Message: "enrolled; certificate " + ca.SerialString(cert),
			Payload: map[string]any{"serial": ca.SerialString(cert), "not_after": cert.NotAfter.UTC().Format(time.RFC3339)}}.Write(ctx, q, now)
		return err
	})
	switch {
	case errors.Is(err, store.ErrTokenUsed):
		// Lost a race with another enrollment using the same token.
		s.reused(ctx, tok, now)
		return nil, errRefused
	case errors.Is(err, store.ErrConflict), errors.Is(err, store.ErrNotFound):
		s.refused(ctx, tok.InstanceID, now, err.Error())
		return nil, errRefused
	case err != nil:
		return nil, err
	}
	return &Issued{InstanceID: inst.ID, Cert: cert}, nil
}

// Renew issues a new certificate for the caller's instance, for a fresh key.
func (s *Service) Renew(ctx context.Context, instanceID string, current crypto.PublicKey, csrPEM string) (*Issued, error) {
	if csrPEM == "" {
		return nil, fail.Invalid("csr_pem", "required")
	}
	if len(csrPEM) > MaxCSRBytes {
		return nil, fail.Invalid("csr_pem", "%d bytes is more than the %d a CSR needs", len(csrPEM), MaxCSRBytes)
	}
	csr, err := ca.ParseCSR([]byte(csrPEM))
	if err != nil {
		return nil, fail.Invalid("csr_pem", "%v", err)
	}
	if k, ok := current.(interface{ Equal(crypto.PublicKey) bool }); ok && k.Equal(csr.PublicKey) {
		return nil, fail.Invalid("csr_pem", "renewal needs a fresh key; this CSR reuses the current certificate's key")
	}
	inst, err := s.Store.GetInstance(ctx, instanceID)
	if err != nil {
		return nil, err
	}
	if inst.Status == "terminated" {
		return nil, fail.Precondition("instance %s is terminated; it cannot renew its certificate", instanceID)
	}
	now := s.Clock.Now()
	cert, err := s.CA.SignNode(ctx, csr, instanceID, s.Lifetime)
	if err != nil {
		return nil, fail.Invalid("csr_pem", "%v", err)
	}
	err = s.Store.Tx(ctx, func(q store.Queries) error {
		if err := q.CreateCertificate(ctx, record(cert, instanceID, now)); err != nil {
			return err
		}
		_, err := events.E{Kind: events.CertRenewed, InstanceID: instanceID, Message: "certificate renewed: " + ca.SerialString(cert),
			Payload: map[string]any{"serial": ca.SerialString(cert)}}.Write(ctx, q, now)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &Issued{InstanceID: instanceID, Cert: cert}, nil
}

func record(cert *x509.Certificate, instanceID string, now time.Time) *store.Certificate {
	return &store.Certificate{Serial: ca.SerialString(cert), InstanceID: instanceID, Kind: store.CertKindNode,
		Subject: pki.InstanceURI(instanceID).String(), NotBefore: cert.NotBefore, NotAfter: cert.NotAfter, CreatedAt: now}
}

// reused records a replayed token: somebody holds a secret that was
// already spent, which an operator must look at.
func (s *Service) reused(ctx context.Context, tok *store.Token, now time.Time) {
	s.Log.Warn("enrollment refused: token already used", "instance", tok.InstanceID)
	if _, err := (events.E{Kind: events.EnrollTokenReused, Severity: events.High, InstanceID: tok.InstanceID,
		Message: fmt.Sprintf("a bootstrap token of instance %s was presented again after it was used", tok.InstanceID),
		Payload: map[string]any{"used_at": tok.UsedAt.UTC().Format(time.RFC3339)}}).Write(ctx, s.Store, now); err != nil {
		s.Log.Error("write token reuse event", "err", err)
	}
}

func (s *Service) refused(ctx context.Context, instanceID string, now time.Time, why string) {
	s.Log.Warn("enrollment refused", "instance", instanceID, "reason", why)
	if _, err := (events.E{Kind: events.EnrollRefused, Severity: events.Medium, InstanceID: instanceID,
		Message: "enrollment refused: " + why}).Write(ctx, s.Store, now); err != nil {
		s.Log.Error("write enrollment refusal event", "err", err)
	}
}
