package store

import (
	"context"
	"time"
)

// Presence is the evidence that an instance's agent is there: the stream
// one replica holds for it, and the lease that replica keeps renewing
// (docs/design.md §2.10). A claim takes only members whose presence is
// open and whose lease has not run out, so a crashed replica's agents
// stop being claimable when its leases do, and a restarted control plane
// hands out nothing until the agents come back.
type Presence struct {
	InstanceID InstanceID
	// Replica names the replica that holds (or held) the stream.
	Replica string
	// StreamID tells one stream from the next of the same instance, so a
	// stream ending late cannot close its successor's presence.
	StreamID    string
	ConnectedAt time.Time
	LeaseUntil  time.Time
	// LostAt is when the stream ended; nil while it is open.
	LostAt *time.Time
}

// Live reports whether p is positive evidence at now.
func (p *Presence) Live(now time.Time) bool {
	return p != nil && p.LostAt == nil && now.Before(p.LeaseUntil)
}

// PresenceQueries keep agent presence.
type PresenceQueries interface {
	// OpenPresence records a stream that opened, replacing the instance's
	// previous presence whichever replica held it.
	OpenPresence(ctx context.Context, p *Presence) error
	// ClosePresence records that the stream streamID ended at at; a newer
	// stream's presence is left alone. It reports whether it closed one.
	ClosePresence(ctx context.Context, instanceID InstanceID, streamID string, at time.Time) (bool, error)
	// RenewPresence extends the lease of every open presence replica
	// holds to until, in one statement, and returns how many it renewed.
	RenewPresence(ctx context.Context, replica string, until time.Time) (int64, error)
	// ExpirePresence closes, at at, every open presence replica holds
	// (every one when replica is ""): a replica starting holds no stream,
	// whatever its predecessor left behind.
	ExpirePresence(ctx context.Context, replica string, at time.Time) (int64, error)
	// ListPresence returns the presence of each of ids that has one.
	ListPresence(ctx context.Context, ids []InstanceID) (map[InstanceID]*Presence, error)
}
