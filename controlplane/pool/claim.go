package pool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/pool/claims"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/providers"
)

// AcquireParams selects the pool to claim from: PoolID, else PoolName,
// else any active pool with a ready member, narrowed by LifecycleClass.
// AcquiredBy and AcquiredFor are free text recorded on the claim.
type AcquireParams struct {
	PoolID                   store.PoolID
	PoolName, LifecycleClass string
	AcquiredBy, AcquiredFor  string
}

// Claim is an acquired member.
type Claim struct {
	ID       store.ClaimID
	Pool     *store.Pool
	Instance *store.Instance
	NodeName string
}

const maxAttribution = 256

// errNoReady ends a claim transaction that found no ready member.
var errNoReady = errors.New("no ready member")

// exhausted is the claims of one batch that found no ready member. The
// first of their callers to answer counts the pool's members for all of
// them (noReady), so claimers hammering an empty pool cost one count a
// batch rather than one each, and the batch's claims that got a member
// do not wait for it.
type exhausted struct {
	s     *Service
	named *store.Pool
	class string
	once  sync.Once
	why   error
}

func (e *exhausted) Error() string { return errNoReady.Error() }
func (e *exhausted) Unwrap() error { return errNoReady }

// explain is the ResourceExhausted answer. The count outlives the caller
// that runs it: the others of the batch wait for the same answer.
func (e *exhausted) explain(ctx context.Context) error {
	e.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
		defer cancel()
		e.why = e.s.noReady(ctx, e.named, e.class)
	})
	return e.why
}

// Acquire claims the oldest ready member of an active pool, atomically:
// the member row is taken with SKIP LOCKED on PostgreSQL (one writer at a
// time on SQLite), and the pool.claimed event that records who claimed it
// and for what is written in the same transaction, so a claim the ledger
// cannot record is rolled back rather than handed out unattributed. With
// no ready member it answers ResourceExhausted (NoReadyMembers) and nudges
// a replenish.
func (s *Service) Acquire(ctx context.Context, p AcquireParams) (*Claim, error) {
	for _, f := range []struct {
		name, v string
		max     int
	}{{"pool_id", string(p.PoolID), 64}, {"pool_name", p.PoolName, 63}, {"acquired_by", p.AcquiredBy, maxAttribution}, {"acquired_for", p.AcquiredFor, maxAttribution}} {
		if len(f.v) > f.max {
			return nil, fail.Invalid(f.name, "at most %d characters", f.max)
		}
	}
	if err := checkClass("lifecycle_class", p.LifecycleClass); err != nil {
		return nil, err
	}
	c, named, err := s.claims().claim(ctx, &claimReq{poolID: p.PoolID, poolName: p.PoolName, class: p.LifecycleClass,
		acquiredBy: p.AcquiredBy, acquiredFor: p.AcquiredFor})
	var none *exhausted
	if errors.As(err, &none) {
		var poolID store.PoolID
		if named != nil {
			poolID = named.ID
		}
		s.Nudge(poolID)
		return nil, none.explain(ctx)
	}
	if err != nil {
		return nil, err
	}
	// The claim took a ready member out of the target: start its
	// replacement now rather than on the reaper's next tick.
	s.Nudge(c.Pool.ID)
	return c, nil
}

// refusal is a claim refused for its pool (not found, not active, of
// another class): every claim of the batch shares the pool and the
// class, so it is every claim's answer, with no retry one by one.
type refusal struct{ err error }

func (r refusal) Error() string { return r.err.Error() }
func (r refusal) Unwrap() error { return r.err }

// poolFor reads the pool a claim names, inside the claim's transaction,
// and refuses it unless it is active and of the class asked for: nil for
// a claim by class alone. It is read once for a batch rather than once
// per caller before it: at 32 claimers that read was a third of what
// PostgreSQL spent on a claim, and read in the transaction it is the
// state the claim commits against.
func poolFor(ctx context.Context, q store.Queries, r *claimReq) (*store.Pool, error) {
	var named *store.Pool
	var err error
	switch {
	case r.poolID != "":
		if named, err = q.GetPoolByID(ctx, r.poolID); errors.Is(err, store.ErrNotFound) {
			return nil, refusal{fail.NotFound("pool id %q does not exist", r.poolID)}
		}
	case r.poolName != "":
		if named, err = q.GetPool(ctx, r.poolName); errors.Is(err, store.ErrNotFound) {
			return nil, refusal{err}
		}
	default:
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if named.Status != store.PoolActive {
		return nil, refusal{fail.Precondition("pool %q is %s; acquire is allowed only from an active pool", named.Name, named.Status)}
	}
	if r.class != "" && r.class != named.LifecycleClass {
		return nil, refusal{fail.Invalid("lifecycle_class", "pool %q is %s, not %s", named.Name, named.LifecycleClass, r.class)}
	}
	return named, nil
}

// claimTx claims a member for each request (all of one pool selection)
// inside q's transaction: the member rows in one statement (SKIP LOCKED on
// PostgreSQL), their new state, and for each a pool.claimed event that
// records who claimed it and for what. It returns a claim per request,
// nil where no ready member was left; errNoReady when there was none.
func (s *Service) claimTx(ctx context.Context, q store.Queries, reqs []*claimReq, now time.Time) (*store.Pool, []*Claim, error) {
	r0 := reqs[0]
	named, err := poolFor(ctx, q, r0)
	if err != nil {
		return nil, nil, err
	}
	var poolID store.PoolID
	if named != nil {
		poolID = named.ID
	}
	cs := make([]store.PoolClaim, len(reqs))
	for i, r := range reqs {
		cs[i] = store.PoolClaim{ClaimID: store.ClaimID(uuid.Must(uuid.NewV7()).String()), AcquiredBy: r.acquiredBy, AcquiredFor: r.acquiredFor}
	}
	ms, err := s.claimLive(ctx, q, poolID, r0.class, cs, now)
	if err != nil {
		return named, nil, err
	}
	pools := map[store.PoolID]*store.Pool{}
	out := make([]*Claim, len(reqs))
	evs := make([]events.E, 0, len(ms))
	for i, m := range ms {
		if m == nil {
			continue
		}
		r := reqs[i]
		owner := named
		if owner == nil {
			if owner = pools[m.PoolID]; owner == nil {
				if owner, err = q.GetPoolByID(ctx, m.PoolID); err != nil {
					return nil, nil, err
				}
				pools[m.PoolID] = owner
			}
		}
		evs = append(evs, events.E{Kind: events.PoolClaimed, InstanceID: m.ID, PoolID: m.PoolID, CorrelationID: m.ClaimID.Correlation(),
			Message: fmt.Sprintf("claim %s: member %s of pool %s claimed by %q for %q", m.ClaimID, m.ID, owner.Name, r.acquiredBy, r.acquiredFor),
			Payload: claims.Attribution(m, owner.Name)})
		out[i] = &Claim{ID: m.ClaimID, Pool: owner, Instance: m}
	}
	if err := nameNodes(ctx, q, out); err != nil {
		return nil, nil, err
	}
	if _, err := events.WriteAll(ctx, q, now, evs...); err != nil {
		return nil, nil, fmt.Errorf("record %d claim(s): %w", len(evs), err)
	}
	return named, out, nil
}

// nameNodes sets each claim's NodeName with one read for the batch, in
// its transaction: read per claim after the commit, the name cost three
// statements a claim (the node, its MACs, its EKs), which at 32 claimers
// was most of what PostgreSQL spent on a claim.
func nameNodes(ctx context.Context, q store.Queries, cs []*Claim) error {
	ids := make([]store.NodeID, 0, len(cs))
	for _, c := range cs {
		if c != nil {
			ids = append(ids, c.Instance.NodeID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	names, err := q.NodeNames(ctx, ids)
	if err != nil {
		return fmt.Errorf("name the claimed members' nodes: %w", err)
	}
	for _, c := range cs {
		if c != nil {
			c.NodeName = names[c.Instance.NodeID]
		}
	}
	return nil
}

// claimLive claims a member for each claim in cs (aligned with them, nil
// where none was left) and hands out none whose machine its provider has
// seen exit: the presence lease of a replica killed with -9, or a stream
// whose end has not reached the store yet, can still vouch for an agent
// that is gone, and the provider's own observation outranks both (design
// §4.4). Such a member is parked errored in the same transaction, so no
// one ever saw it claimed, and its claim is made again on another member.
// errNoReady when no claim got a member and none was parked (a parked
// member must commit, claimed or not).
func (s *Service) claimLive(ctx context.Context, q store.Queries, poolID store.PoolID, class string, cs []store.PoolClaim, now time.Time) ([]*store.Instance, error) {
	out := make([]*store.Instance, len(cs))
	todo := make([]int, len(cs))
	for i := range todo {
		todo[i] = i
	}
	got, parked := 0, 0
	for len(todo) > 0 {
		batch := make([]store.PoolClaim, len(todo))
		for j, i := range todo {
			batch[j] = cs[i]
		}
		ms, err := q.ClaimPoolMembers(ctx, poolID, class, batch, now)
		if errors.Is(err, store.ErrNotFound) {
			break
		}
		if err != nil {
			return nil, err
		}
		// Every pass parks at least one member or ends the loop, and the
		// ready members are finite.
		var again []int
		for j, m := range ms {
			if detail, dead := s.exited(m); dead {
				if err := s.parkExited(ctx, q, m, detail, now); err != nil {
					return nil, err
				}
				again = append(again, todo[j])
				parked++
				continue
			}
			out[todo[j]] = m
			got++
		}
		todo = again
	}
	if got == 0 && parked == 0 {
		return nil, errNoReady
	}
	return out, nil
}

// exited asks m's provider, where it can tell locally, whether m's machine
// has exited.
func (s *Service) exited(m *store.Instance) (string, bool) {
	if m.CloudInstanceID == "" {
		return "", false
	}
	p, err := s.Instances.Provider(m.Provider)
	if err != nil {
		return "", false
	}
	r, ok := p.(providers.ExitReporter)
	if !ok {
		return "", false
	}
	return r.Exited(m.CloudInstanceID)
}

// parkExited takes a member whose machine exited out of the claim it was
// just given, inside the claim's transaction: errored, as provider sync
// errors a running row whose machine it observes stopped, and parked
// errored in its pool so the errored ladder terminates what is left of it
// and the pool replaces it.
func (s *Service) parkExited(ctx context.Context, q store.Queries, m *store.Instance, detail string, now time.Time) error {
	reason := fmt.Sprintf("machine exited outside Tether (%s); seen when a claim took it, so it was not handed out", detail)
	m.ClaimID, m.AcquiredBy, m.AcquiredFor, m.PoolAcquiredAt = "", "", "", nil
	m.PoolState, m.PoolTerminateAttempts, m.PoolNextTerminateAt = lifecycle.PoolErrored, 0, &now
	m.ErrorMessage = reason
	if err := s.Instances.TransitionTx(ctx, q, m, lifecycle.MarkErrored, reason, now); err != nil {
		return fmt.Errorf("park member %s whose machine exited: %w", m.ID, err)
	}
	if _, err := (events.E{Kind: events.InstanceErrored, Severity: events.High, InstanceID: m.ID, PoolID: m.PoolID, Message: reason,
		Payload: events.MachineExitedPayload{Detail: detail, Machine: m.CloudInstanceID, Observed: "exited",
			Provider: m.Provider, Source: "claim"}}).Write(ctx, q, now); err != nil {
		return fmt.Errorf("park member %s whose machine exited: %w", m.ID, err)
	}
	// A nudge of a transaction that then rolls back costs one replenish
	// pass that finds nothing to do.
	s.Nudge(m.PoolID)
	return nil
}

// noReady is the ResourceExhausted answer, with the counts that explain it.
func (s *Service) noReady(ctx context.Context, named *store.Pool, class string) error {
	if named == nil {
		where := "no active pool"
		if class != "" {
			where += " of class " + class
		}
		return fail.Exhausted("NoReadyMembers: %s has a ready member whose agent is connected; a replenish was requested", where)
	}
	c, err := s.Store.CountPoolMembers(ctx, named.ID)
	if err != nil {
		return fail.Exhausted("NoReadyMembers: pool %q has no ready member; a replenish was requested", named.Name)
	}
	if c.Ready > 0 {
		// Ready by their rows, but no replica vouches for their agents: a
		// control plane that just restarted, a replica that crashed, or
		// machines that died. They become claimable as their agents
		// reconnect (design §4.4).
		return fail.Exhausted("NoReadyMembers: pool %q has no ready member whose agent is connected (%d ready without a connected agent, "+
			"claimable once it reconnects; warming %d, claimed %d, target %d); a replenish was requested",
			named.Name, c.Ready, c.Warming, c.Claimed, named.TargetSize)
	}
	return fail.Exhausted("NoReadyMembers: pool %q has no ready member (warming %d, claimed %d, target %d); a replenish was requested",
		named.Name, c.Warming, c.Claimed, named.TargetSize)
}

// Released is the outcome of a release.
type Released struct {
	// Disposition is recycled, reused, cordoned or errored.
	Disposition string
	ClaimID     store.ClaimID
	Held        time.Duration
	Instance    *store.Instance
	NodeName    string
	// Err is the terminate failure behind an errored disposition: the
	// member is errored and its machine may still run.
	Err error
}

// Release returns a claimed member to its pool. By default it is recycled:
// fenced to draining, then terminated; the claim closes with the outcome,
// recycled in the transaction that marks the member terminated, or errored
// (the member parked errored, on the retry ladder) in the one that records
// the failure. A reuse_without_reset pool takes the member back as ready
// with a fresh TTL anchor (reused), or fences it if it carries a cordon
// marker (cordoned). Every disposition writes pool.released with the
// claim's attribution and held_seconds.
func (s *Service) Release(ctx context.Context, instanceID store.InstanceID, by string) (*Released, error) {
	if instanceID == "" {
		return nil, fail.Invalid("instance_id", "required")
	}
	now := s.Clock.Now()
	out := &Released{}
	recycle := false
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		in, err := q.LockInstance(ctx, instanceID)
		if err != nil {
			return err
		}
		switch {
		case in.PoolID == "":
			return fail.Precondition("instance %s is not a pool member; release returns a claimed pool member", in.ID)
		case in.Status.Terminal():
			return fail.Precondition("instance %s is terminated; its claim closed when it ended", in.ID)
		case in.PoolState != lifecycle.PoolClaimed:
			return fail.Precondition("member %s is %s; release is allowed only for a claimed member", in.ID, in.PoolState)
		}
		pl, err := q.GetPoolByID(ctx, in.PoolID)
		if err != nil {
			return err
		}
		pol := PolicyOf(pl)
		out.ClaimID, out.Held, out.Instance = in.ClaimID, claims.Held(in, now), in
		switch {
		case pol.ReuseWithoutReset && in.Cordon != nil:
			out.Disposition = claims.Cordoned
			if _, err := claims.Close(ctx, q, in, claims.Cordoned, "", now); err != nil {
				return err
			}
			in.PoolState = lifecycle.PoolDraining
		case pol.ReuseWithoutReset && in.Status == lifecycle.Running:
			out.Disposition = claims.Reused
			if _, err := claims.Close(ctx, q, in, claims.Reused, "", now); err != nil {
				return err
			}
			in.PoolState, in.PoolReadyAt = lifecycle.PoolReady, &now
		default:
			// The claim stays open until the terminate's outcome closes it;
			// if we die first, the reaper finds a draining member with an
			// open claim and finishes the job.
			recycle = true
			in.PoolState = lifecycle.PoolDraining
		}
		in.UpdatedAt = now
		return q.UpdateInstance(ctx, in)
	})
	if err != nil {
		return nil, err
	}
	if recycle {
		// The caller leaving must not leave the release half done.
		_, terr := s.Instances.Terminate(context.WithoutCancel(ctx), instanceID)
		out.Disposition = claims.Recycled
		if terr != nil {
			if _, err := s.parkErrored(context.WithoutCancel(ctx), instanceID, "release", terr, true); err != nil {
				return nil, errors.Join(terr, fmt.Errorf("record the failed terminate of %s: %w", instanceID, err))
			}
		}
		if out.Instance, err = s.Store.GetInstance(ctx, instanceID); err != nil {
			return nil, err
		}
		// Judge by the row, not by the call: a terminate that failed here
		// may have been finished by a concurrent one.
		if terr != nil && !out.Instance.Status.Terminal() {
			out.Disposition, out.Err = claims.Errored, terr
		}
	}
	if out.Disposition != claims.Reused {
		// The member left the claimed count (recycled, fenced or parked):
		// under a binding max_size that frees room for a replacement.
		s.Nudge(out.Instance.PoolID)
	}
	s.Log.Info("pool member released", "instance", instanceID, "claim", out.ClaimID, "by", by, "disposition", out.Disposition,
		"held", out.Held.Truncate(time.Second), "err", out.Err)
	if n, err := s.Store.GetNodeByID(ctx, out.Instance.NodeID); err == nil {
		out.NodeName = n.Name
	}
	return out, nil
}

// parkErrored records a failed terminate of a member on its way out:
// pool state errored, the first rung of the retry ladder scheduled, an open
// claim closed as errored and, with emit, pool.terminate_failed (high), in
// one transaction. It reports false when there was nothing to park: the
// member ended after all, or a terminate of it is still under way (its
// intent recorded), which the terminate reconciler finishes.
func (s *Service) parkErrored(ctx context.Context, id store.InstanceID, during string, terr error, emit bool) (bool, error) {
	now := s.Clock.Now()
	parked := false
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		in, err := q.LockInstance(ctx, id)
		if err != nil {
			return err
		}
		if in.Status.Terminal() || in.TerminateRequestedAt != nil || in.PoolState == lifecycle.PoolClaimed {
			return nil
		}
		parked = true
		msg := "terminate failed: " + terr.Error()
		if claims.Open(in) {
			if _, err := claims.Close(ctx, q, in, claims.Errored, msg, now); err != nil {
				return err
			}
		}
		if in.PoolState != lifecycle.PoolErrored {
			next := now.Add(s.backoff(1))
			in.PoolState, in.PoolTerminateAttempts, in.PoolNextTerminateAt = lifecycle.PoolErrored, 0, &next
		}
		if in.ErrorMessage == "" {
			// A refusal (an ops hold) leaves no message of its own.
			in.ErrorMessage = msg
		}
		in.UpdatedAt = now
		if err := q.UpdateInstance(ctx, in); err != nil {
			return err
		}
		if !emit {
			return nil
		}
		_, err = events.E{Kind: events.PoolTerminateFailed, Severity: events.High, InstanceID: id, PoolID: in.PoolID,
			Message: fmt.Sprintf("%s: terminate of member %s failed; parked errored, its machine may still run: %v", during, id, terr),
			Payload: events.TerminateFailuresPayload{During: during, Error: terr.Error(), FailedInstanceIDs: []store.InstanceID{id}}}.Write(ctx, q, now)
		return err
	})
	return parked, err
}

// ReadyHook moves a warming member to ready when its agent first reports
// phase=ready, in the transaction that records it (instances.ReadyHook).
// A member that carries a cordon marker goes to draining instead: it is
// not to be handed out.
func (s *Service) ReadyHook(ctx context.Context, q store.Queries, in *store.Instance) error {
	if in.PoolID == "" || in.PoolState != lifecycle.PoolWarming || in.Status != lifecycle.Running {
		return nil
	}
	now := s.Clock.Now()
	state := lifecycle.PoolReady
	if in.Cordon != nil {
		state = lifecycle.PoolDraining
	}
	in.PoolState, in.PoolReadyAt, in.UpdatedAt = state, &now, now
	if err := q.UpdateInstance(ctx, in); err != nil {
		return fmt.Errorf("member %s ready: %w", in.ID, err)
	}
	warm := time.Duration(0)
	if in.PoolWarmingStartedAt != nil {
		warm = now.Sub(*in.PoolWarmingStartedAt)
	}
	_, err := events.E{Kind: events.PoolMemberReady, InstanceID: in.ID, PoolID: in.PoolID,
		Message: fmt.Sprintf("member %s is %s after warming %s", in.ID, state, warm.Truncate(time.Second)),
		Payload: events.MemberReadyPayload{PoolState: state, WarmSeconds: int64(warm / time.Second)}}.Write(ctx, q, now)
	return err
}
