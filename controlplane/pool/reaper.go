package pool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/pool/claims"
	"github.com/tetherfleet/tether/controlplane/store"
)

// RecycleResult counts what phase 1 did to one pool. Every count is of
// outcomes, not attempts: a terminate that failed is in TerminateFailed,
// never in Recycled or Replaced.
type RecycleResult struct {
	// Recycled ready members (TTL, stale heartbeat, errored instance, or a
	// draining pool), warming members of a draining pool and leftover
	// draining members, terminated.
	Recycled int
	// Replaced warming members (timed out, or their provision failed),
	// terminated; the replenish phase provisions their replacements.
	Replaced int
	// Flagged claimed members newly flagged stale (by TTL or heartbeat).
	Flagged int
	// Retried errored members whose retried terminate landed.
	Retried int
	// Abandoned errored members whose ladder ran out this tick.
	Abandoned int
	// Pruned dead member records and the nodes deleted with them.
	Pruned, NodesDeleted int
	// TerminateFailed terminates that failed this tick (each member is
	// errored and, unless abandoned, on the ladder).
	TerminateFailed int
}

func (r *RecycleResult) add(o RecycleResult) {
	r.Recycled += o.Recycled
	r.Replaced += o.Replaced
	r.Flagged += o.Flagged
	r.Retried += o.Retried
	r.Abandoned += o.Abandoned
	r.Pruned += o.Pruned
	r.NodesDeleted += o.NodesDeleted
	r.TerminateFailed += o.TerminateFailed
}

func (r RecycleResult) any() bool { return r != RecycleResult{} }

// TickResult sums a reaper tick over every pool.
type TickResult struct {
	Pools     int
	Recycle   RecycleResult
	Replenish ReplenishResult
}

// Tick is one reaper round (docs/design.md §4.6): phase 1, recycle, for every active
// and draining pool; phase 2, replenish, for active pools only. A failing
// pool does not stop the others; their errors are joined.
func (s *Service) Tick(ctx context.Context) (TickResult, error) {
	var out TickResult
	stale, err := s.currentStaleAfter(ctx)
	if err != nil {
		return out, err
	}
	var errs []error
	err = s.eachPool(ctx, func(p *store.Pool) error {
		if p.Status != store.PoolActive && p.Status != store.PoolDraining {
			return nil
		}
		out.Pools++
		rr, err := s.recycle(ctx, p, stale)
		out.Recycle.add(rr)
		if err != nil {
			errs = append(errs, fmt.Errorf("recycle pool %s: %w", p.Name, err))
		}
		var rp ReplenishResult
		if p.Status == store.PoolActive && ctx.Err() == nil {
			rp = s.replenish(ctx, p.ID)
			out.Replenish.Provisioned += rp.Provisioned
			out.Replenish.Failed += rp.Failed
			if rp.Err != nil && !errors.Is(rp.Err, errNotActive) {
				errs = append(errs, fmt.Errorf("replenish pool %s: %w", p.Name, rp.Err))
			}
		}
		level := s.Log.Debug
		if rr.any() || rp.Provisioned > 0 || rp.Failed > 0 {
			level = s.Log.Info
		}
		level("pool reaper tick", "pool", p.Name, "status", p.Status,
			"recycled", rr.Recycled, "replaced", rr.Replaced, "flagged", rr.Flagged, "retried", rr.Retried,
			"abandoned", rr.Abandoned, "pruned", rr.Pruned, "nodes_deleted", rr.NodesDeleted, "terminate_failed", rr.TerminateFailed,
			"provisioned", rp.Provisioned, "provision_failed", rp.Failed)
		return ctx.Err()
	})
	if err != nil {
		errs = append(errs, err)
	}
	return out, errors.Join(errs...)
}

// Recycle runs phase 1 for one pool now (not for an archived one).
func (s *Service) Recycle(ctx context.Context, name string) (*View, RecycleResult, error) {
	p, err := s.byName(ctx, name)
	if err != nil {
		return nil, RecycleResult{}, err
	}
	if p.Status == store.PoolArchived {
		return nil, RecycleResult{}, fail.Precondition("pool %q is archived; recycle is allowed for an active, paused or draining pool", p.Name)
	}
	stale, err := s.currentStaleAfter(ctx)
	if err != nil {
		return nil, RecycleResult{}, err
	}
	// An operator's call: finish what it started even if they hang up.
	r, err := s.recycle(context.WithoutCancel(ctx), p, stale)
	if err != nil {
		return nil, r, err
	}
	v, err := s.view(ctx, s.Store, p, false)
	return v, r, err
}

func (s *Service) currentStaleAfter(ctx context.Context) (time.Duration, error) {
	n, err := s.Store.CountInstances(ctx, store.InstanceFilter{Statuses: []lifecycle.State{lifecycle.Running}})
	if err != nil {
		return 0, fmt.Errorf("pool reaper: count running instances: %w", err)
	}
	return s.staleAfter(n), nil
}

// A terminate the recycle phase decided on.
type termination struct {
	id     store.InstanceID
	ok     func(*store.Instance) bool
	mutate func(store.Queries, *store.Instance) error
	// counts picks the outcome counter.
	counts func(*RecycleResult) *int
	during string
}

func heartbeatAnchor(in *store.Instance) time.Time {
	for _, t := range []*time.Time{in.LastHeartbeatAt, in.PoolReadyAt, in.PoolAcquiredAt} {
		if t != nil {
			return *t
		}
	}
	return in.CreatedAt
}

func readyAnchor(in *store.Instance) time.Time {
	for _, t := range []*time.Time{in.PoolReadyAt, in.PoolWarmingStartedAt} {
		if t != nil {
			return *t
		}
	}
	return in.CreatedAt
}

// abandoned: the ladder spent its attempts and gave up (no next attempt).
func abandoned(in *store.Instance, pol Policy) bool {
	return in.PoolTerminateAttempts >= pol.TerminateMaxAttempts && in.PoolNextTerminateAt == nil
}

// prunable reports a dead member record past its retention. A member in
// error is pruned only once nothing here will act on it again: its ladder
// was abandoned, or an operator's cordon fenced it. Everything else in
// error is terminated by the rules below first.
func prunable(in *store.Instance, pol Policy, now time.Time) bool {
	if pol.Retention <= 0 || now.Sub(in.UpdatedAt) < pol.Retention {
		return false
	}
	switch in.Status {
	case lifecycle.Terminated:
		return true
	case lifecycle.Error:
		if in.TerminateRequestedAt != nil {
			return false // a terminate is under way: the reconciler's
		}
		switch in.PoolState {
		case lifecycle.PoolErrored:
			return abandoned(in, pol)
		case lifecycle.PoolDraining:
			return in.Cordon != nil
		}
	}
	return false
}

// recycle is phase 1 for one pool: it reads the members once, handles the
// cheap decisions (flags, pruning, abandoning) in line and runs the
// terminates with bounded concurrency. Every change is re-checked under
// the member's row lock, so a member claimed, released or uncordoned since
// the read is left alone.
func (s *Service) recycle(ctx context.Context, p *store.Pool, staleAfter time.Duration) (RecycleResult, error) {
	var r RecycleResult
	now := s.Clock.Now()
	pol := PolicyOf(p)
	var terms []termination
	var errs []error
	toDraining := func(_ store.Queries, in *store.Instance) error { in.PoolState = lifecycle.PoolDraining; return nil }
	err := s.eachMember(ctx, p.ID, nil, func(in *store.Instance) error {
		if prunable(in, pol, now) {
			pruned, nodeGone, err := s.prune(ctx, in.ID, pol)
			if err != nil {
				errs = append(errs, err)
			}
			if pruned {
				r.Pruned++
			}
			if nodeGone {
				r.NodesDeleted++
			}
			return nil
		}
		if in.Status.Terminal() {
			return nil
		}
		errored := in.Status == lifecycle.Error
		switch in.PoolState {
		case lifecycle.PoolWarming:
			if p.Status == store.PoolDraining {
				// It would only be recycled once ready: no claim can reach a
				// draining pool, so its machine is spent warming for nothing.
				terms = append(terms, termination{id: in.ID, during: "recycle: pool draining",
					ok:     func(c *store.Instance) bool { return c.PoolState == lifecycle.PoolWarming },
					mutate: toDraining, counts: func(r *RecycleResult) *int { return &r.Recycled }})
				return nil
			}
			expired := in.PoolWarmingStartedAt != nil && now.Sub(*in.PoolWarmingStartedAt) > pol.WarmingTimeout
			if !errored && !expired {
				return nil
			}
			why := "warming timeout"
			if errored {
				why = "provision failed"
			}
			terms = append(terms, termination{id: in.ID, during: "recycle: " + why,
				ok: func(c *store.Instance) bool {
					return c.PoolState == lifecycle.PoolWarming && (c.Status == lifecycle.Error ||
						(c.PoolWarmingStartedAt != nil && now.Sub(*c.PoolWarmingStartedAt) > pol.WarmingTimeout))
				},
				mutate: toDraining, counts: func(r *RecycleResult) *int { return &r.Replaced }})
		case lifecycle.PoolReady:
			why, stale := s.readyVerdict(p, in, pol, now, staleAfter)
			if why == "" {
				return nil
			}
			t := termination{id: in.ID, during: "recycle: " + why, mutate: toDraining, counts: func(r *RecycleResult) *int { return &r.Recycled },
				ok: func(c *store.Instance) bool {
					w, _ := s.readyVerdict(p, c, pol, now, staleAfter)
					return c.PoolState == lifecycle.PoolReady && w == why
				}}
			if stale {
				t.mutate = func(q store.Queries, c *store.Instance) error {
					c.PoolState = lifecycle.PoolDraining
					_, err := events.E{Kind: events.PoolReadyStaleHeartbeat, Severity: events.Medium, InstanceID: c.ID, PoolID: c.PoolID,
						Message: fmt.Sprintf("ready member %s: no heartbeat since %s (stale after %s); recycled early",
							c.ID, heartbeatAnchor(c).UTC().Format(time.RFC3339), staleAfter),
						Payload: events.ReadyStaleHeartbeatPayload{LastHeartbeatAt: heartbeatAnchor(c).UTC().Format(time.RFC3339Nano),
							StaleAfterSeconds: int64(staleAfter / time.Second)}}.Write(ctx, q, now)
					return err
				}
			}
			terms = append(terms, t)
		case lifecycle.PoolClaimed:
			n, err := s.flagClaimed(ctx, in, pol, now, staleAfter)
			r.Flagged += n
			if err != nil {
				errs = append(errs, err)
			}
		case lifecycle.PoolDraining:
			// A fenced member is the operator's until they uncordon it; a
			// terminate under way is the reconciler's. Anything else that
			// sat draining past the grace is a release or recycle whose
			// terminate never happened.
			leftover := func(c *store.Instance) bool {
				return c.PoolState == lifecycle.PoolDraining && c.Cordon == nil && c.TerminateRequestedAt == nil &&
					now.Sub(c.UpdatedAt) >= s.drainingGrace()
			}
			if leftover(in) {
				terms = append(terms, termination{id: in.ID, during: "recycle: draining leftover", ok: leftover,
					mutate: func(store.Queries, *store.Instance) error { return nil }, counts: func(r *RecycleResult) *int { return &r.Recycled }})
			}
		case lifecycle.PoolErrored:
			if in.TerminateRequestedAt != nil {
				return nil
			}
			if in.PoolTerminateAttempts >= pol.TerminateMaxAttempts {
				if in.PoolNextTerminateAt != nil { // the cap was lowered under it
					ok, err := s.abandon(ctx, in.ID, pol, "the attempt cap was lowered to its count")
					if err != nil {
						errs = append(errs, err)
					} else if ok {
						r.Abandoned++
					}
				}
				return nil
			}
			if in.PoolNextTerminateAt != nil && now.Before(*in.PoolNextTerminateAt) {
				return nil
			}
			terms = append(terms, s.retry(in.ID, pol, now))
		}
		return nil
	})
	if err != nil {
		errs = append(errs, err)
	}
	s.runTerminations(ctx, terms, pol, &r, &errs)
	return r, errors.Join(errs...)
}

// readyVerdict says why a ready member should be recycled ("" if it
// should not), and whether the reason is a stale heartbeat.
func (s *Service) readyVerdict(p *store.Pool, in *store.Instance, pol Policy, now time.Time, staleAfter time.Duration) (string, bool) {
	switch {
	case p.Status == store.PoolDraining:
		return "pool draining", false
	case in.Status == lifecycle.Error:
		return "instance errored", false
	case now.Sub(readyAnchor(in)) > pol.ReadyTTL:
		return "ready ttl", false
	case in.Status == lifecycle.Running && now.Sub(heartbeatAnchor(in)) > staleAfter:
		return "stale heartbeat", true
	}
	return "", false
}

// retry is one rung of the errored-member ladder. The attempt is recorded
// (count and next time) before the provider is called, so a crash or a new
// leader cannot retry faster than the ladder allows.
func (s *Service) retry(id store.InstanceID, pol Policy, now time.Time) termination {
	due := func(c *store.Instance) bool {
		return c.PoolState == lifecycle.PoolErrored && c.TerminateRequestedAt == nil && c.PoolTerminateAttempts < pol.TerminateMaxAttempts &&
			(c.PoolNextTerminateAt == nil || !now.Before(*c.PoolNextTerminateAt))
	}
	return termination{id: id, during: "retry", ok: due, counts: func(r *RecycleResult) *int { return &r.Retried },
		mutate: func(_ store.Queries, c *store.Instance) error {
			c.PoolTerminateAttempts++
			next := now.Add(s.backoff(c.PoolTerminateAttempts + 1))
			c.PoolNextTerminateAt = &next
			return nil
		}}
}

func (s *Service) runTerminations(ctx context.Context, terms []termination, pol Policy, r *RecycleResult, errs *[]error) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, s.concurrency())
	for _, t := range terms {
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			ok, err := s.take(ctx, t.id, t.ok, t.mutate)
			if err != nil || !ok {
				if err != nil {
					mu.Lock()
					*errs = append(*errs, fmt.Errorf("%s %s: %w", t.during, t.id, err))
					mu.Unlock()
				}
				return
			}
			// A retry's failure is already recorded on the ladder; the
			// other terminates park the member and say so.
			terr := s.terminateMember(ctx, t.id, t.during, t.during != "retry")
			gaveUp := false
			if terr != nil && t.during == "retry" && ctx.Err() == nil {
				var aerr error
				gaveUp, aerr = s.abandonIfSpent(ctx, t.id, pol, terr)
				if aerr != nil {
					mu.Lock()
					*errs = append(*errs, aerr)
					mu.Unlock()
				}
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case terr == nil:
				*t.counts(r)++
			default:
				r.TerminateFailed++
				if gaveUp {
					r.Abandoned++
				}
			}
		}()
	}
	wg.Wait()
}

// abandonIfSpent ends the ladder of a member whose last allowed attempt
// just failed.
func (s *Service) abandonIfSpent(ctx context.Context, id store.InstanceID, pol Policy, terr error) (bool, error) {
	in, err := s.Store.GetInstance(ctx, id)
	if err != nil {
		return false, err
	}
	if in.PoolTerminateAttempts < pol.TerminateMaxAttempts {
		return false, nil
	}
	return s.abandon(ctx, id, pol, terr.Error())
}

// abandon gives up on an errored member, loudly: pool.terminate_abandoned
// (high), and no further attempt. Its machine may still run and bill.
func (s *Service) abandon(ctx context.Context, id store.InstanceID, pol Policy, last string) (bool, error) {
	now := s.Clock.Now()
	return s.take(ctx, id, func(c *store.Instance) bool {
		return c.PoolState == lifecycle.PoolErrored && c.PoolTerminateAttempts >= pol.TerminateMaxAttempts && c.PoolNextTerminateAt != nil
	}, func(q store.Queries, c *store.Instance) error {
		c.PoolNextTerminateAt = nil
		_, err := events.E{Kind: events.PoolTerminateAbandoned, Severity: events.High, InstanceID: c.ID, PoolID: c.PoolID,
			Message: fmt.Sprintf("member %s: gave up terminating after %d attempt(s); its machine %q may still run: %s",
				c.ID, c.PoolTerminateAttempts, c.CloudInstanceID, last),
			Payload: events.TerminateAbandonedPayload{Attempts: c.PoolTerminateAttempts, Error: last, Machine: c.CloudInstanceID}}.Write(ctx, q, now)
		return err
	})
}

// flagClaimed flags a claimed member past its claimed TTL or with a stale
// heartbeat. Flags only: a claimed member belongs to its claimer, so the
// reaper never terminates it. Each flag fires once per claim: the TTL flag
// is reset only by a new claim; the heartbeat flag is also reset by a
// returning heartbeat, so its event is written only if this claim has
// none yet.
func (s *Service) flagClaimed(ctx context.Context, in *store.Instance, pol Policy, now time.Time, staleAfter time.Duration) (int, error) {
	overdue := func(c *store.Instance) bool {
		return !c.ClaimedStaleFlagged && c.PoolAcquiredAt != nil && now.Sub(*c.PoolAcquiredAt) > pol.ClaimedTTL
	}
	silent := func(c *store.Instance) bool {
		return !c.HeartbeatStaleFlagged && now.Sub(heartbeatAnchor(c)) > staleAfter
	}
	if !overdue(in) && !silent(in) {
		return 0, nil
	}
	n := 0
	claim := in.ClaimID
	corr := claim.Correlation()
	_, err := s.take(ctx, in.ID, func(c *store.Instance) bool {
		return c.PoolState == lifecycle.PoolClaimed && c.ClaimID == claim && (overdue(c) || silent(c))
	}, func(q store.Queries, c *store.Instance) error {
		pl, err := q.GetPoolByID(ctx, c.PoolID)
		if err != nil {
			return err
		}
		held := claims.Held(c, now)
		if overdue(c) {
			c.ClaimedStaleFlagged = true
			p := claims.Attribution(c, pl.Name).Stale(int64(held/time.Second), int64(pol.ClaimedTTL/time.Second))
			if _, err := (events.E{Kind: events.PoolClaimedStale, Severity: events.Medium, InstanceID: c.ID, PoolID: c.PoolID, CorrelationID: corr,
				Message: fmt.Sprintf("claim %s on %s held %s, past the claimed TTL %s (flagged only)", claim, c.ID, held.Truncate(time.Second), pol.ClaimedTTL),
				Payload: p}).Write(ctx, q, now); err != nil {
				return err
			}
			n++
		}
		if silent(c) {
			c.HeartbeatStaleFlagged = true
			prior, err := q.ListEvents(ctx, store.EventFilter{Kind: events.PoolClaimedStaleHeartbeat, CorrelationID: corr}, store.Page{Limit: 1})
			if err != nil {
				return err
			}
			if claim == "" || len(prior) == 0 {
				p := claims.Attribution(c, pl.Name).Silent(heartbeatAnchor(c).UTC().Format(time.RFC3339Nano))
				if _, err := (events.E{Kind: events.PoolClaimedStaleHeartbeat, Severity: events.Medium, InstanceID: c.ID, PoolID: c.PoolID, CorrelationID: corr,
					Message: fmt.Sprintf("claimed member %s: no heartbeat since %s (flagged only)", c.ID, heartbeatAnchor(c).UTC().Format(time.RFC3339)),
					Payload: p}).Write(ctx, q, now); err != nil {
					return err
				}
				n++
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("flag claimed member %s: %w", in.ID, err)
	}
	return n, nil
}

// prune deletes a dead member record past retention, re-checked under its
// row lock, and its node once nothing else is left on it.
func (s *Service) prune(ctx context.Context, id store.InstanceID, pol Policy) (pruned, nodeGone bool, err error) {
	now := s.Clock.Now()
	err = s.Store.Tx(ctx, func(q store.Queries) error {
		in, err := q.LockInstance(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if !prunable(in, pol, now) {
			return nil
		}
		if nodeGone, err = pruneTx(ctx, q, in); err != nil {
			return err
		}
		pruned = true
		return nil
	})
	if err != nil {
		return false, false, fmt.Errorf("prune member %s: %w", id, err)
	}
	return pruned, nodeGone, nil
}
