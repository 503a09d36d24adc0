// Package certificates writes certificate revocations: the revoked mark,
// its event and the notification that tells every replica, in one
// transaction.
package certificates

import (
	"context"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/clock"
)

// Service revokes certificates.
type Service struct {
	Store store.Store
	Clock clock.Clock
}

// DefaultReason is recorded when an operator gives none.
const DefaultReason = "revoked by operator"

// Revoke marks serial revoked with reason (DefaultReason if empty), writes
// cert.revoked naming who asked, and notifies every replica's revocation
// set once the transaction commits.
func (s *Service) Revoke(ctx context.Context, serial, reason, by string) (*store.Certificate, error) {
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
			Message: "certificate " + c.Serial + " revoked: " + c.RevokeReason,
			Payload: map[string]any{"serial": c.Serial, "by": by}}).Write(ctx, q, now); err != nil {
			return err
		}
		return q.Notify(ctx, store.ChannelRevocations, c.Serial)
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}
