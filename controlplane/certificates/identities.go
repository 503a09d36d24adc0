package certificates

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"strings"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/pki"
	"github.com/tetherfleet/tether/pki/ca"
)

// Admin identities: a named certificate holder with a role. Issuing one
// records the certificate, the identity and a cert.issued event together;
// revoking one revokes every certificate it was issued, with a
// cert.revoked event and a notification per serial, together.

// IdentityIssue is one admin certificate to issue.
type IdentityIssue struct {
	Name string
	Role store.Role
	Key  crypto.PublicKey
	// TTL is the certificate's lifetime (zero: ca.DefaultAdminLifetime).
	TTL time.Duration
	// Renew issues to an identity that exists and is not revoked; without
	// it the identity must not exist yet.
	Renew bool
	// By names the caller in the event.
	By string
}

// Issued is an identity and the certificate just issued to it.
type Issued struct {
	Identity *store.AdminIdentity
	Cert     *x509.Certificate
	// Issuer is the CA certificate that signed Cert.
	Issuer *x509.Certificate
}

// IssueIdentity signs an admin certificate with s.CA and records it, the
// identity and the event in one transaction. Creating an identity that
// exists is AlreadyExists; renewing a revoked one is FailedPrecondition.
func (s *Service) IssueIdentity(ctx context.Context, in IdentityIssue) (*Issued, error) {
	if s.CA == nil {
		return nil, fail.Internal("issue identity %s: no CA is wired into the certificate service", in.Name)
	}
	cert, err := s.CA.SignAdmin(in.Name, in.Role.String(), in.Key, in.TTL)
	if err != nil {
		return nil, fail.Internal("sign identity %s: %v", in.Name, err)
	}
	now := s.Clock.Now()
	serial := store.CertSerial(ca.SerialString(cert))
	issuer := s.CA.IssuerOf(cert)
	id := &store.AdminIdentity{Name: in.Name, Role: in.Role, Serial: serial, NotAfter: cert.NotAfter, CreatedAt: now}
	err = s.Store.Tx(ctx, func(q store.Queries) error {
		prev, err := q.GetAdminIdentity(ctx, in.Name)
		switch {
		case err == nil && !in.Renew:
			return fail.Exists("identity %q already exists (role %s); revoke it first, or renew it as that identity", in.Name, prev.Role)
		case err == nil:
			if !prev.RevokedAt.IsZero() {
				return fail.Precondition("identity %q is revoked", in.Name)
			}
			id.CreatedAt = prev.CreatedAt
		case !errors.Is(err, store.ErrNotFound):
			return err
		}
		subject := pki.Identity{Kind: pki.KindAdmin, Name: in.Name, Role: in.Role.String()}.String()
		if err := q.CreateCertificate(ctx, &store.Certificate{Serial: serial, Kind: pki.KindAdmin, Subject: subject,
			Issuer: pki.Fingerprint(issuer.Raw), NotBefore: cert.NotBefore, NotAfter: cert.NotAfter, CreatedAt: now}); err != nil {
			return err
		}
		if err := q.PutAdminIdentity(ctx, id); err != nil {
			return err
		}
		_, err = events.E{Kind: events.CertIssued, Message: "admin identity " + in.Name + " (" + in.Role.String() + ") certificate " + serial.String() + " issued",
			Payload: events.IdentityIssuedPayload{By: in.By, Identity: in.Name, Role: in.Role, Serial: serial}}.Write(ctx, q, now)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &Issued{Identity: id, Cert: cert, Issuer: issuer}, nil
}

// RevokeAdminIdentity marks the identity revoked and revokes every
// certificate it was ever issued (renewal leaves the earlier ones valid
// until they expire), with the event and a notification per serial, in
// one transaction. It returns the identity and the serials revoked now,
// which the caller adds to its own revocation set at once. Revoking a
// revoked identity again revokes any of its certificates still left.
func (s *Service) RevokeAdminIdentity(ctx context.Context, name, by string) (*store.AdminIdentity, []store.CertSerial, error) {
	now := s.Clock.Now()
	var id *store.AdminIdentity
	var serials []store.CertSerial
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		var err error
		if id, err = q.GetAdminIdentity(ctx, name); err != nil {
			return err
		}
		if id.RevokedAt.IsZero() {
			id.RevokedAt = now
			if err := q.PutAdminIdentity(ctx, id); err != nil {
				return err
			}
		}
		reason := "identity " + id.Name + " revoked by " + by
		if serials, err = RevokeIdentity(ctx, q, id, reason, now); err != nil {
			return err
		}
		if len(serials) == 0 {
			return nil
		}
		if _, err := (events.E{Kind: events.CertRevoked, Severity: events.Medium,
			Message: "admin identity " + id.Name + " revoked (certificates " + joinSerials(serials) + ")",
			Payload: events.IdentityRevokedPayload{By: by, Identity: id.Name, Serial: id.Serial, Serials: serials}}).Write(ctx, q, now); err != nil {
			return err
		}
		for _, serial := range serials {
			if err := q.Notify(ctx, store.ChannelRevocations, serial.String()); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return id, serials, nil
}

// joinSerials lists serials for an event's message.
func joinSerials(serials []store.CertSerial) string {
	s := make([]string, len(serials))
	for i, x := range serials {
		s[i] = x.String()
	}
	return strings.Join(s, ", ")
}
