// Package certificates writes certificates' records: a revocation's mark,
// its event and the notification that tells every replica, and an admin
// identity's certificate, identity row and event, each in one transaction.
package certificates

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/pki"
	"github.com/tetherfleet/tether/pki/ca"
)

// Service revokes certificates and issues admin identities.
type Service struct {
	Store store.Store
	Clock clock.Clock
	// CA signs admin identities' certificates (IssueIdentity refuses
	// without it).
	CA *ca.CA
}

// DefaultReason is recorded when an operator gives none.
const DefaultReason = "revoked by operator"

// Revoke marks serial revoked with reason (DefaultReason if empty), writes
// cert.revoked naming who asked, and notifies every replica's revocation
// set once the transaction commits.
func (s *Service) Revoke(ctx context.Context, serial store.CertSerial, reason, by string) (*store.Certificate, error) {
	if reason == "" {
		reason = DefaultReason
	}
	now := s.Clock.Now()
	var c *store.Certificate
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		var err error
		if c, err = q.RevokeCertificate(ctx, serial, reason, now); err != nil {
			return err
		}
		if _, err := (events.E{Kind: events.CertRevoked, Severity: events.Medium, InstanceID: c.InstanceID,
			Message: "certificate " + c.Serial.String() + " revoked: " + c.RevokeReason,
			Payload: events.CertRevokedPayload{By: by, Serial: c.Serial}}).Write(ctx, q, now); err != nil {
			return err
		}
		return q.Notify(ctx, store.ChannelRevocations, c.Serial.String())
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// RevokeIdentity revokes an admin identity's current certificate and every
// earlier one (renewal leaves them valid until they expire; all carry the
// identity's subject), inside the caller's transaction, and returns the
// serials it revoked now, sorted. The caller writes the event and the
// notifications.
func RevokeIdentity(ctx context.Context, q store.Queries, id *store.AdminIdentity, reason string, now time.Time) ([]store.CertSerial, error) {
	subject := pki.Identity{Kind: pki.KindAdmin, Name: id.Name, Role: id.Role.String()}.String()
	live := map[store.CertSerial]bool{id.Serial: true}
	for page := (store.Page{Limit: store.MaxPageSize}); ; {
		certs, err := q.ListCertificates(ctx, store.CertificateFilter{Subject: subject}, page)
		if err != nil {
			return nil, err
		}
		for _, c := range certs {
			live[c.Serial] = c.RevokedAt == nil
		}
		if len(certs) < page.Limit {
			break
		}
		page.After = certs[len(certs)-1].Serial.String()
	}
	var out []store.CertSerial
	for serial, ok := range live {
		if !ok {
			continue
		}
		if _, err := q.RevokeCertificate(ctx, serial, reason, now); errors.Is(err, store.ErrNotFound) {
			continue // a certificate issued before identities were recorded
		} else if err != nil {
			return nil, err
		}
		out = append(out, serial)
	}
	slices.Sort(out)
	return out, nil
}
