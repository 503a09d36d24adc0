// Package pool runs warm instance pools (docs/design.md §4): pools and their
// members' pool states, the atomic claim and its release, the drain, and
// the reaper tick that recycles stale members, retries and abandons failed
// terminates, prunes dead records and replenishes active pools.
//
// Machines are created and destroyed only through the instance service,
// so a member's provision and terminate are the same two-phase,
// crash-safe operations every instance gets; this package decides which
// member to act on and records the pool's side of it.
package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/liveness"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/clock"
)

// Service is the pool service. Fields left zero take the defaults below.
type Service struct {
	Store     store.Store
	Clock     clock.Clock
	Log       *slog.Logger
	Instances *instances.Service

	// StaleHeartbeatAfter is how long a ready or claimed member's agent may
	// be quiet before it counts as stale. It stretches with the fleet's
	// size the way liveness does, because agents of a large fleet are told
	// to heartbeat less often (zero: liveness.DefaultSilentAfter).
	StaleHeartbeatAfter time.Duration
	// MaxHeartbeatsPerSecond is the agents' heartbeat budget that stretch
	// is computed from (zero: liveness.DefaultMaxHeartbeatsPerSecond).
	MaxHeartbeatsPerSecond float64
	// RetryBase and RetryMax shape the errored-member terminate ladder:
	// retry n waits RetryBase × 2^(n-1), at most RetryMax.
	RetryBase, RetryMax time.Duration
	// DrainingGrace is how long a draining member with no terminate under
	// way and no cordon may sit before the reaper concludes its terminate
	// never happened (a release or recycle cut short) and does it.
	DrainingGrace time.Duration
	// TerminateConcurrency bounds the provider terminates a drain or a
	// recycle runs at once.
	TerminateConcurrency int
	// ClaimLanes is how many claim transactions for one pool may run at
	// once, each for a batch of waiting claimers (zero: 1 on SQLite, 2 on
	// PostgreSQL; see batch.go).
	ClaimLanes int
	// ClaimBatch caps the claims one transaction takes (zero:
	// MaxClaimBatch; 1 gives every claim a transaction of its own).
	ClaimBatch int

	// Nudges is the queue of pools to replenish soon. The composition root
	// makes it first and hands it to the instance service as its
	// instances.PoolEvents too, which closes the cycle between the two
	// services at construction (nil: the service makes its own).
	Nudges *Nudges

	nudgeOnce sync.Once
	batchOnce sync.Once
	batch     *batcher
}

// Defaults of docs/design.md §4.1 and of the Service's tuning fields.
const (
	DefaultWarmingTimeout       = 600 * time.Second
	DefaultReadyTTL             = 3600 * time.Second
	DefaultClaimedTTL           = 86400 * time.Second
	DefaultRetentionDays        = 7
	DefaultTerminateMaxAttempts = 5
	// DefaultMaxHeadroom is max_size's default above target_size.
	DefaultMaxHeadroom = 10
	// RosterCap caps the member roster of a pool's view; counts never are.
	RosterCap = 50
	// DefaultReaperEvery is the reaper's tick (the daemon's default).
	DefaultReaperEvery = 60 * time.Second

	DefaultRetryBase            = time.Minute
	DefaultRetryMax             = time.Hour
	DefaultDrainingGrace        = 5 * time.Minute
	DefaultTerminateConcurrency = 4
)

func (s *Service) retryBase() time.Duration { return orDefault(s.RetryBase, DefaultRetryBase) }
func (s *Service) retryMax() time.Duration  { return orDefault(s.RetryMax, DefaultRetryMax) }
func (s *Service) drainingGrace() time.Duration {
	return orDefault(s.DrainingGrace, DefaultDrainingGrace)
}

func (s *Service) concurrency() int {
	if s.TerminateConcurrency > 0 {
		return s.TerminateConcurrency
	}
	return DefaultTerminateConcurrency
}

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// backoff is the wait before retry attempt n (n ≥ 1) of the ladder.
func (s *Service) backoff(n int) time.Duration {
	d := s.retryBase()
	for i := 1; i < n && d < s.retryMax(); i++ {
		d *= 2
	}
	return min(d, s.retryMax())
}

// staleAfter is the heartbeat staleness threshold for a fleet of running
// instances n.
func (s *Service) staleAfter(n int) time.Duration {
	return liveness.TTL(orDefault(s.StaleHeartbeatAfter, liveness.DefaultSilentAfter), n, s.MaxHeartbeatsPerSecond, liveness.DefaultGrace)
}

// Policy is a pool's metadata with the defaults applied.
type Policy struct {
	WarmingTimeout, ReadyTTL, ClaimedTTL time.Duration
	// Retention is how long dead member records are kept; zero disables
	// pruning.
	Retention            time.Duration
	ReuseWithoutReset    bool
	TerminateMaxAttempts int
}

// PolicyOf applies the defaults to p's metadata.
func PolicyOf(p *store.Pool) Policy {
	m := p.Metadata
	sec := func(v int, def time.Duration) time.Duration {
		if v > 0 {
			return time.Duration(v) * time.Second
		}
		return def
	}
	days := DefaultRetentionDays
	if m.RecordRetentionDays != nil {
		days = *m.RecordRetentionDays
	}
	attempts := m.ErroredTerminateMaxAttempts
	if attempts <= 0 {
		attempts = DefaultTerminateMaxAttempts
	}
	return Policy{
		WarmingTimeout: sec(m.WarmingTimeoutSeconds, DefaultWarmingTimeout),
		ReadyTTL:       sec(m.ReadyTTLSeconds, DefaultReadyTTL),
		ClaimedTTL:     sec(m.ClaimedTTLSeconds, DefaultClaimedTTL),
		Retention:      time.Duration(days) * 24 * time.Hour, ReuseWithoutReset: m.ReuseWithoutReset,
		TerminateMaxAttempts: attempts,
	}
}

// Effective is p's metadata with every default written out, as operators
// should see it.
func Effective(p *store.Pool) store.PoolMetadata {
	pol := PolicyOf(p)
	days := int(pol.Retention / (24 * time.Hour))
	return store.PoolMetadata{
		WarmingTimeoutSeconds: int(pol.WarmingTimeout / time.Second), ReadyTTLSeconds: int(pol.ReadyTTL / time.Second),
		ClaimedTTLSeconds: int(pol.ClaimedTTL / time.Second), RecordRetentionDays: &days,
		ReuseWithoutReset: pol.ReuseWithoutReset, ErroredTerminateMaxAttempts: pol.TerminateMaxAttempts,
	}
}

// need is how many members a replenish provisions now: up to the target
// (ready + warming), and never past max_size over every live member that
// holds a machine for the pool (ready + warming + claimed).
func need(p *store.Pool, c store.PoolCounts) int {
	deficit := p.TargetSize - (c.Ready + c.Warming)
	headroom := p.MaxSize - (c.Ready + c.Warming + c.Claimed)
	return max(0, min(deficit, headroom))
}

// Deficit is how far a pool is below its target.
func Deficit(p *store.Pool, c store.PoolCounts) int {
	return max(0, p.TargetSize-(c.Ready+c.Warming))
}

// View is a pool as operators see it.
type View struct {
	Pool         *store.Pool
	TemplateName string
	Counts       store.PoolCounts
	Deficit      int
	// Members is the roster (Get only), ordered by pool state, then by
	// warming start, capped at RosterCap.
	Members []Member
}

// Member is one roster entry.
type Member struct {
	Instance *store.Instance
	NodeName string
}

// byName reads a pool by name, refusing a blank one.
func (s *Service) byName(ctx context.Context, name string) (*store.Pool, error) {
	if name == "" {
		return nil, fail.Invalid("name", "required")
	}
	return s.Store.GetPool(ctx, name)
}

func (s *Service) view(ctx context.Context, q store.Queries, p *store.Pool, roster bool) (*View, error) {
	v := &View{Pool: p}
	if tpl, err := q.GetTemplateByID(ctx, p.TemplateID); err == nil {
		v.TemplateName = tpl.Name
	} else if !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	c, err := q.CountPoolMembers(ctx, p.ID)
	if err != nil {
		return nil, fmt.Errorf("pool %s: %w", p.Name, err)
	}
	v.Counts, v.Deficit = c, Deficit(p, c)
	if !roster {
		return v, nil
	}
	// One query per pool state keeps the roster in (state, warming start)
	// order without a store method of its own; the cap bounds the work.
	for _, state := range []lifecycle.PoolState{lifecycle.PoolWarming, lifecycle.PoolReady, lifecycle.PoolClaimed, lifecycle.PoolDraining, lifecycle.PoolErrored} {
		left := RosterCap - len(v.Members)
		if left <= 0 {
			break
		}
		ins, err := q.ListInstances(ctx, store.InstanceFilter{PoolID: p.ID, PoolStates: []lifecycle.PoolState{state}, Statuses: liveStatuses, OldestFirst: true},
			store.Page{Limit: left})
		if err != nil {
			return nil, fmt.Errorf("pool %s roster: %w", p.Name, err)
		}
		for _, in := range ins {
			m := Member{Instance: in}
			if n, err := q.GetNodeByID(ctx, in.NodeID); err == nil {
				m.NodeName = n.Name
			}
			v.Members = append(v.Members, m)
		}
	}
	return v, nil
}

// liveStatuses are the instance states a counted member may be in.
var liveStatuses = []lifecycle.State{lifecycle.Pending, lifecycle.Provisioning, lifecycle.Starting, lifecycle.Running, lifecycle.Stopping,
	lifecycle.Stopped, lifecycle.Rebooting, lifecycle.Error}

// Nudge asks for a replenish of a pool ("" for every active pool) soon,
// without waiting for the reaper's tick: whatever changes a pool's counts
// (a claim, a release, a member terminated or fenced) calls it. It never
// blocks: a nudge that finds the queue full is dropped, since the nudges
// already queued and the reaper's tick cover it anyway.
func (s *Service) Nudge(poolID store.PoolID) { s.nudgeQueue().MemberLeft(poolID) }

func (s *Service) nudgeQueue() *Nudges {
	s.nudgeOnce.Do(func() {
		if s.Nudges == nil {
			s.Nudges = NewNudges()
		}
	})
	return s.Nudges
}

func (s *Service) nudgeCh() chan store.PoolID { return s.nudgeQueue().ch }

// Nudges queues pools whose counts changed for the pool service to
// replenish. It implements instances.PoolEvents.
type Nudges struct{ ch chan store.PoolID }

// NewNudges makes an empty queue.
func NewNudges() *Nudges { return &Nudges{ch: make(chan store.PoolID, 64)} }

// MemberLeft queues poolID ("" for every active pool). It never blocks:
// a nudge that finds the queue full is dropped, since the nudges already
// queued and the reaper's tick cover it anyway.
func (n *Nudges) MemberLeft(poolID store.PoolID) {
	select {
	case n.ch <- poolID:
	default:
	}
}

// RunNudges replenishes nudged pools until ctx ends. Any replica may run
// it: a replenish recounts under the pool's row lock for every member it
// adds, so two replicas replenishing one pool never overshoot (docs/adr/0008).
func (s *Service) RunNudges(ctx context.Context) {
	ch := s.nudgeCh()
	for {
		select {
		case <-ctx.Done():
			return
		case first := <-ch:
			s.serve(ctx, first)
		}
	}
}

// ServeNudges replenishes the pools nudged so far and returns how many
// distinct nudges it served, without waiting for more (0: none queued).
// RunNudges does the same as nudges arrive; tests call this to step it.
func (s *Service) ServeNudges(ctx context.Context) int {
	select {
	case first := <-s.nudgeCh():
		return s.serve(ctx, first)
	default:
		return 0
	}
}

// serve replenishes first and whatever queued meanwhile.
func (s *Service) serve(ctx context.Context, first store.PoolID) int {
	ch := s.nudgeCh()
	// Coalesce what queued meanwhile: twelve claims on one pool need one
	// replenish, not twelve.
	pending := map[store.PoolID]bool{first: true}
drain:
	for {
		select {
		case id := <-ch:
			pending[id] = true
		default:
			break drain
		}
	}
	if pending[""] {
		pending = map[store.PoolID]bool{"": true}
	}
	for id := range pending {
		s.replenishNudged(ctx, id)
	}
	return len(pending)
}

func (s *Service) replenishNudged(ctx context.Context, poolID store.PoolID) {
	ids := []store.PoolID{poolID}
	if poolID == "" {
		ids = nil
		err := s.eachPool(ctx, func(p *store.Pool) error {
			if p.Status == store.PoolActive {
				ids = append(ids, p.ID)
			}
			return nil
		})
		if err != nil {
			s.Log.Warn("pool nudge: list pools", "err", err)
			return
		}
	}
	for _, id := range ids {
		r := s.replenish(ctx, id)
		if r.Err != nil && !errors.Is(r.Err, errNotActive) {
			s.Log.Warn("pool nudge: replenish", "pool", id, "provisioned", r.Provisioned, "failed", r.Failed, "err", r.Err)
		} else if r.Provisioned > 0 {
			s.Log.Info("pool nudge: replenished", "pool", id, "provisioned", r.Provisioned)
		}
	}
}

// eachPool calls fn for every pool, a page at a time.
func (s *Service) eachPool(ctx context.Context, fn func(*store.Pool) error) error {
	page := store.Page{Limit: store.MaxPageSize}
	for {
		ps, err := s.Store.ListPools(ctx, page)
		if err != nil {
			return err
		}
		for _, p := range ps {
			if err := fn(p); err != nil {
				return err
			}
		}
		if len(ps) < page.Limit {
			return nil
		}
		page.After = ps[len(ps)-1].Name
	}
}

// eachMember calls fn for every member of a pool in the given instance
// states (all when none), a page at a time. fn sees a snapshot; whatever
// it changes it re-reads under the row lock first.
func (s *Service) eachMember(ctx context.Context, poolID store.PoolID, statuses []lifecycle.State, fn func(*store.Instance) error) error {
	page := store.Page{Limit: store.MaxPageSize}
	for {
		ins, err := s.Store.ListInstances(ctx, store.InstanceFilter{PoolID: poolID, Statuses: statuses}, page)
		if err != nil {
			return err
		}
		for _, in := range ins {
			if err := fn(in); err != nil {
				return err
			}
		}
		if len(ins) < page.Limit {
			return nil
		}
		page.After = ins[len(ins)-1].ID.String()
	}
}
