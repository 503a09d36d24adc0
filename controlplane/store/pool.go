package store

import (
	"context"
	"time"
)

// Pool statuses and lifecycle classes as stored.
const (
	PoolActive   = "active"
	PoolPaused   = "paused"
	PoolDraining = "draining"
	PoolArchived = "archived"

	ClassEphemeral = "ephemeral"
	ClassSpot      = "spot"
)

// PoolMetadata carries the timeouts and policies of docs/design.md §4.1. Zero values
// mean the defaults (see controlplane/pool).
type PoolMetadata struct {
	WarmingTimeoutSeconds       int  `json:"warming_timeout_seconds,omitempty"`
	ReadyTTLSeconds             int  `json:"ready_ttl_seconds,omitempty"`
	ClaimedTTLSeconds           int  `json:"claimed_ttl_seconds,omitempty"`
	RecordRetentionDays         *int `json:"record_retention_days,omitempty"`
	ReuseWithoutReset           bool `json:"reuse_without_reset,omitempty"`
	ErroredTerminateMaxAttempts int  `json:"errored_terminate_max_attempts,omitempty"`
}

// Pool is a set of pre-warmed instances.
type Pool struct {
	ID                PoolID
	Name              string
	TemplateID        TemplateID
	Provider          string
	Region            string
	InstanceType      string
	LifecycleClass    string
	TargetSize        int
	MinSize           int
	MaxSize           int
	Status            string
	Metadata          PoolMetadata
	LastReplenishedAt *time.Time
	CreatedAt         time.Time
	UpdatedAt         time.Time
}

// PoolCounts are live member counts by pool state; terminated members do
// not count.
type PoolCounts struct {
	Warming, Ready, Claimed, Draining, Errored int
}

// PoolClaim is what ClaimPoolMembers writes on one claimed member.
type PoolClaim struct {
	ClaimID                 ClaimID
	AcquiredBy, AcquiredFor string
}

// PoolQueries are the pool methods of Queries.
type PoolQueries interface {
	CreatePool(ctx context.Context, p *Pool) error
	GetPool(ctx context.Context, name string) (*Pool, error)
	GetPoolByID(ctx context.Context, id PoolID) (*Pool, error)
	// LockPool reads a pool and locks its row on PostgreSQL.
	LockPool(ctx context.Context, id PoolID) (*Pool, error)
	ListPools(ctx context.Context, p Page) ([]*Pool, error)
	UpdatePool(ctx context.Context, p *Pool) error
	// DeletePool refuses (ErrConflict) while the pool has members that are
	// not terminated.
	DeletePool(ctx context.Context, id PoolID) error
	CountPoolMembers(ctx context.Context, poolID PoolID) (PoolCounts, error)
	// ClaimPoolMember locks and returns the oldest ready member (by warming
	// start) of an active pool: SKIP LOCKED on PostgreSQL, so concurrent
	// claimers never get the same member. With poolID empty it picks any
	// active pool with a ready member, narrowed by class when given. It
	// returns ErrNotFound when there is none. The caller updates the member
	// and writes the claim event in the same transaction. A member whose
	// terminate is under way (terminate_requested_at set) is never handed out,
	// nor one whose agent is not present at at (an open presence whose lease
	// runs past at, see Presence).
	ClaimPoolMember(ctx context.Context, poolID PoolID, class string, at time.Time) (*Instance, error)
	// ClaimPoolMembers claims up to len(claims) ready members at once, as
	// ClaimPoolMember selects them: the i-th oldest gets claims[i], state
	// claimed and acquired at, and the stale flags reset, in one statement
	// (a batch of claims pays one round trip, not one each). It returns the
	// claimed members in claims order (fewer when fewer are ready), or
	// ErrNotFound when none is. The caller writes the claim events in the
	// same transaction.
	ClaimPoolMembers(ctx context.Context, poolID PoolID, class string, claims []PoolClaim, at time.Time) ([]*Instance, error)
	// DeletePoolMember deletes a dead member's row (status terminated or
	// error): the pruning of docs/design.md §4.6. It refuses (ErrConflict) a member that
	// is alive or not a pool member, so it cannot take a live machine's row.
	DeletePoolMember(ctx context.Context, id InstanceID) error
}
