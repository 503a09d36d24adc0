package pool

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
)

// DrainResult is what a drain did. Drained counts only members whose
// terminate landed; a failed one is in TerminateFailed and FailedIDs.
type DrainResult struct {
	View             *View
	Drained          int
	TerminateFailed  int
	ClaimedRemaining int
	FailedIDs        []store.InstanceID
}

// Drain winds a pool down: status draining (nothing is claimed from it or
// added to it from then on), every ready member fenced and terminated,
// claimed members left to run out their work. A member whose terminate
// fails is parked errored, where the reaper's ladder retries it, and one
// high-severity pool.terminate_failed names every failed member. The
// target is kept, so activating the pool again restores it. Draining a
// draining pool terminates whatever became ready since.
func (s *Service) Drain(ctx context.Context, name string) (*DrainResult, error) {
	p, changed, err := s.setStatus(ctx, name, "drain", store.PoolDraining, store.PoolActive, store.PoolPaused)
	if err != nil {
		return nil, err
	}
	// The caller leaving must not leave the drain half done and its
	// counts unrecorded.
	ctx = context.WithoutCancel(ctx)
	var ready []store.InstanceID
	if err := s.eachMember(ctx, p.ID, liveStatuses, func(in *store.Instance) error {
		if in.PoolState == lifecycle.PoolReady {
			ready = append(ready, in.ID)
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("drain pool %s: %w", p.Name, err)
	}
	var fenced []store.InstanceID
	for _, id := range ready {
		// Under the row lock: a member claimed a moment ago stays claimed.
		ok, err := s.take(ctx, id, func(in *store.Instance) bool { return in.PoolState == lifecycle.PoolReady },
			func(_ store.Queries, in *store.Instance) error { in.PoolState = lifecycle.PoolDraining; return nil })
		if err != nil {
			return nil, fmt.Errorf("drain pool %s: fence %s: %w", p.Name, id, err)
		}
		if ok {
			fenced = append(fenced, id)
		}
	}
	failed := s.terminateAll(ctx, fenced, "drain", false)
	out := &DrainResult{Drained: len(fenced) - len(failed), TerminateFailed: len(failed)}
	for id := range failed {
		out.FailedIDs = append(out.FailedIDs, id)
	}
	slices.Sort(out.FailedIDs)
	if len(failed) > 0 {
		errs := map[string]string{}
		for id, err := range failed {
			errs[id.String()] = err.Error()
		}
		if err := s.writeEvent(ctx, events.E{Kind: events.PoolTerminateFailed, Severity: events.High, PoolID: p.ID,
			Message: fmt.Sprintf("drain of pool %s: %d of %d terminate(s) failed (%v); those members are parked errored and their machines may still run",
				p.Name, len(failed), len(fenced), out.FailedIDs),
			Payload: events.DrainFailedPayload{Drained: out.Drained, During: "drain", Errors: errs,
				FailedInstanceIDs: out.FailedIDs, TerminateFailed: out.TerminateFailed}}); err != nil {
			return nil, fmt.Errorf("drain pool %s: record failures: %w", p.Name, err)
		}
	}
	if out.View, err = s.view(ctx, s.Store, p, false); err != nil {
		return nil, err
	}
	out.ClaimedRemaining = out.View.Counts.Claimed
	s.Log.Info("pool drained", "pool", p.Name, "status_changed", changed, "drained", out.Drained,
		"terminate_failed", out.TerminateFailed, "claimed_remaining", out.ClaimedRemaining, "failed", out.FailedIDs)
	return out, nil
}

// take runs mutate on a member under its row lock if it is not terminated
// and ok(member) still holds, and writes the row. It reports whether it
// did: what the caller decided on a snapshot may no longer be true.
func (s *Service) take(ctx context.Context, id store.InstanceID, ok func(*store.Instance) bool, mutate func(store.Queries, *store.Instance) error) (bool, error) {
	took := false
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		in, err := q.LockInstance(ctx, id)
		if err != nil {
			return err
		}
		if in.Status.Terminal() || !ok(in) {
			return nil
		}
		if err := mutate(q, in); err != nil {
			return err
		}
		in.UpdatedAt = s.Clock.Now()
		took = true
		return q.UpdateInstance(ctx, in)
	})
	return took, err
}

// terminateMember terminates a member on its way out and, if that fails,
// parks it errored. It returns nil when the member ended up terminated.
func (s *Service) terminateMember(ctx context.Context, id store.InstanceID, during string, emit bool) error {
	_, terr := s.Instances.Terminate(ctx, id)
	if terr == nil {
		return nil
	}
	if ctx.Err() != nil {
		// Leadership lost or shutting down: the terminate intent stays for
		// the reconciler, exactly as after a crash.
		return terr
	}
	if _, err := s.parkErrored(ctx, id, during, terr, emit); err != nil {
		s.Log.Error("record a failed member terminate", "instance", id, "during", during, "terminate_err", terr, "err", err)
	}
	in, err := s.Store.GetInstance(ctx, id)
	if err == nil && in.Status.Terminal() {
		return nil // a concurrent terminate finished it
	}
	return terr
}

// terminateAll terminates members with bounded concurrency and returns
// the failures by member id.
func (s *Service) terminateAll(ctx context.Context, ids []store.InstanceID, during string, emit bool) map[store.InstanceID]error {
	failed := map[store.InstanceID]error{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, s.concurrency())
	for _, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := s.terminateMember(ctx, id, during, emit); err != nil {
				mu.Lock()
				failed[id] = err
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return failed
}

func (s *Service) writeEvent(ctx context.Context, e events.E) error {
	now := s.Clock.Now()
	return s.Store.Tx(ctx, func(q store.Queries) error {
		_, err := e.Write(ctx, q, now)
		return err
	})
}
