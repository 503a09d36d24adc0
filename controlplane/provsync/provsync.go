// Package provsync is the provider sync loop (docs/design.md §2.7): it compares
// instance rows with each provider's own list of machines. A running row
// whose machine is gone or stopped goes to error, with what the provider
// observed; Check does the same for one instance at once, on a death
// signal (a provider's exit, an agent stream that dropped); a terminated row whose machine still
// exists is reported (high severity) and the machine destroyed, because a
// guest left running behind a terminated row runs and bills unseen.
package provsync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/providers"
)

// Syncer runs the comparison.
type Syncer struct {
	Store     store.Store
	Clock     clock.Clock
	Log       *slog.Logger
	Instances *instances.Service
	// CallTimeout bounds each provider call (default 1 min).
	CallTimeout time.Duration
	// StreamLostConfirm, when set, is how long after a stopped machine is
	// observed on a dropped stream's check the provider is asked again,
	// and the row moves only if it still says stopped. A dropped stream
	// is a weak signal (an agent restarting, a root switch), and a BMC may
	// report a passing power state around a transition; a provider's own
	// exit signal and the periodic sync need no second look.
	StreamLostConfirm time.Duration

	mu sync.Mutex
	// cannotList holds the providers whose last List said KindUnsupported.
	// Their rows are not read until a List succeeds: at 19,000 external
	// instances the pages read for nothing were ~9% of tetherd's CPU.
	cannotList map[string]bool
}

// Result counts what a tick found and did.
type Result struct {
	// Skipped providers cannot list their machines (external) or failed to.
	Skipped []string
	// Errored running rows whose machine is gone or stopped.
	Errored int
	// GuestsPresent terminated rows whose machine still exists, and
	// Destroyed how many of those machines were destroyed.
	GuestsPresent, Destroyed int
}

func (s *Syncer) timeout() time.Duration {
	if s.CallTimeout > 0 {
		return s.CallTimeout
	}
	return time.Minute
}

// Tick compares every provider once. One provider's failure does not stop
// the others; the errors are joined.
func (s *Syncer) Tick(ctx context.Context) (Result, error) {
	var res Result
	var errs []error
	for _, name := range s.Instances.ProviderNames() {
		p, err := s.Instances.Provider(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := s.syncProvider(ctx, p, &res); err != nil {
			errs = append(errs, fmt.Errorf("provider sync %s: %w", name, err))
		}
	}
	return res, errors.Join(errs...)
}

func (s *Syncer) syncProvider(ctx context.Context, p providers.Provider, res *Result) error {
	if s.lastCannotList(p.Name()) {
		// Ask before reading the rows. A list that succeeds now was taken
		// before the rows, so it is dropped and the usual order follows.
		if _, err := s.list(ctx, p); err != nil {
			return s.listFailed(p.Name(), err, res)
		}
	}
	// Rows first, list second: a running row read before the list cannot
	// have gained its machine after it.
	running, err := s.listMachineOn(ctx, p.Name())
	if err != nil {
		return err
	}
	ms, err := s.list(ctx, p)
	if err != nil {
		return s.listFailed(p.Name(), err, res)
	}
	byID := map[string]providers.Machine{}
	byInstance := map[store.InstanceID]providers.Machine{}
	for _, m := range ms {
		if m.State == providers.StateGone {
			continue
		}
		byID[m.ID] = m
		if m.InstanceID != "" {
			byInstance[store.InstanceID(m.InstanceID)] = m
		}
	}
	for _, in := range running {
		m, ok := byID[in.CloudInstanceID]
		if !ok {
			m, ok = byInstance[in.ID]
		}
		// A listed machine that runs (or whose state the provider cannot
		// tell) is left be: only what the provider observes moves a row.
		if ok && m.State != providers.StateStopped {
			continue
		}
		if _, err := s.confirmDead(ctx, p, in, "provider_sync", res); err != nil {
			return err
		}
	}
	for _, m := range ms {
		if m.InstanceID == "" || m.State == providers.StateGone {
			continue
		}
		in, err := s.Store.GetInstance(ctx, store.InstanceID(m.InstanceID))
		if errors.Is(err, store.ErrNotFound) {
			s.Log.Warn("provider sync: a machine names an instance this control plane does not know", "provider", p.Name(), "machine", m.ID, "instance", m.InstanceID)
			continue
		}
		if err != nil {
			return err
		}
		if in.Status.Terminal() {
			if err := s.guestPresent(ctx, p, in, m, res); err != nil {
				return err
			}
		}
	}
	return nil
}

// list asks p for its machines and remembers whether it said it cannot.
func (s *Syncer) list(ctx context.Context, p providers.Provider) ([]providers.Machine, error) {
	lctx, cancel := context.WithTimeout(ctx, s.timeout())
	ms, err := p.List(lctx)
	cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	if providers.KindOf(err) == providers.KindUnsupported {
		if s.cannotList == nil {
			s.cannotList = map[string]bool{}
		}
		s.cannotList[p.Name()] = true
	} else {
		delete(s.cannotList, p.Name())
	}
	return ms, err
}

func (s *Syncer) lastCannotList(provider string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cannotList[provider]
}

// listFailed records a provider whose list failed as skipped.
func (s *Syncer) listFailed(provider string, err error, res *Result) error {
	res.Skipped = append(res.Skipped, provider)
	if providers.KindOf(err) == providers.KindUnsupported {
		return nil // the provider cannot see its machines (external)
	}
	return err // no list, no conclusions
}

func (s *Syncer) listMachineOn(ctx context.Context, provider string) ([]*store.Instance, error) {
	var out []*store.Instance
	page := store.Page{Limit: store.MaxPageSize}
	for {
		ins, err := s.Store.ListInstances(ctx, store.InstanceFilter{Provider: provider,
			Statuses: []lifecycle.State{lifecycle.Provisioning, lifecycle.Starting, lifecycle.Rebooting, lifecycle.Running}}, page)
		if err != nil {
			return nil, err
		}
		out = append(out, ins...)
		if len(ins) < page.Limit {
			return out, nil
		}
		page.After = ins[len(ins)-1].ID.String()
	}
}

// confirmDead asks the provider for the machine of a row that should be on
// (machineOn) and, if the provider observes it gone or stopped, errors the row with what was
// observed. A pool member leaves ready (parked errored, so the pool
// replaces it and terminates what is left). It reports whether it moved
// the row.
func (s *Syncer) confirmDead(ctx context.Context, p providers.Provider, in *store.Instance, source string, res *Result) (bool, error) {
	if in.TerminateRequestedAt != nil || in.CloudInstanceID == "" {
		return false, nil // a terminate is under way, or nothing to look for
	}
	cctx, cancel := context.WithTimeout(ctx, s.timeout())
	m, err := p.Status(cctx, in.CloudInstanceID)
	cancel()
	if err != nil && !providers.IsNotFound(err) {
		s.Log.Warn("provider sync: status of a machine failed; not concluding", "instance", in.ID, "source", source, "err", err)
		return false, nil
	}
	gone := err != nil || m.State == providers.StateGone
	if !gone && m.State != providers.StateStopped {
		return false, nil // it runs (or the provider cannot tell): no conclusion
	}
	if !gone && source == SourceStreamLost && s.StreamLostConfirm > 0 {
		select {
		case <-ctx.Done():
			return false, nil
		case <-s.Clock.After(s.StreamLostConfirm):
		}
		cctx, cancel := context.WithTimeout(ctx, s.timeout())
		again, err := p.Status(cctx, in.CloudInstanceID)
		cancel()
		if err != nil || again.State != providers.StateStopped {
			s.Log.Info("provider sync: a stopped machine seen on a dropped stream is not stopped a moment later; not concluding",
				"instance", in.ID, "first", m.Detail, "then", again.State, "err", err)
			return false, nil
		}
		m = again
	}
	now := s.Clock.Now()
	// Tx may run fn again (a lost deadlock): count what committed.
	n := 0
	var poolID store.PoolID
	err = s.Store.Tx(ctx, func(q store.Queries) error {
		n, poolID = 0, ""
		cur, err := q.LockInstance(ctx, in.ID)
		if err != nil {
			return err
		}
		if !machineOn(cur.Status) || cur.TerminateRequestedAt != nil {
			return nil
		}
		if busy, err := operationInProgress(ctx, q, cur.ID); err != nil || busy {
			// A stop or reboot stops the machine on purpose while the row
			// still reads running; the operation settles the row by what
			// the provider then observes.
			return err
		}
		var reason string
		state := "gone"
		if gone {
			reason = fmt.Sprintf("machine gone: provider %s no longer has machine %s", p.Name(), cur.CloudInstanceID)
		} else {
			state = string(m.State)
			detail := m.Detail
			if detail == "" {
				detail = "provider " + p.Name() + " reports it " + state
			}
			reason = fmt.Sprintf("machine exited outside Tether (%s)", detail)
		}
		if cur.Status != lifecycle.Running {
			reason += fmt.Sprintf(" while the instance was %s", cur.Status)
		}
		cur.ErrorMessage = reason
		if cur.PoolID != "" && (cur.PoolState == lifecycle.PoolReady || cur.PoolState == lifecycle.PoolWarming) {
			// Out of ready at once; the errored ladder terminates what is
			// left of it, starting on the reaper's next tick.
			cur.PoolState, cur.PoolTerminateAttempts, cur.PoolNextTerminateAt = lifecycle.PoolErrored, 0, &now
			poolID = cur.PoolID
		}
		if err := s.Instances.TransitionTx(ctx, q, cur, lifecycle.MarkErrored, reason, now); err != nil {
			return err
		}
		n++
		_, err = events.E{Kind: events.InstanceErrored, Severity: events.High, InstanceID: cur.ID, PoolID: cur.PoolID, Message: reason,
			Payload: events.MachineExitedPayload{Detail: m.Detail, Machine: cur.CloudInstanceID, Observed: state,
				Provider: p.Name(), Source: source}}.Write(ctx, q, now)
		return err
	})
	if err != nil {
		return false, err
	}
	if res != nil {
		res.Errored += n
	}
	if n > 0 {
		s.Log.Warn("instance errored: its machine is not running", "instance", in.ID, "source", source, "observed", m.State, "detail", m.Detail)
		s.Instances.MemberLeft(poolID)
	}
	return n > 0, nil
}

// operationInProgress reports whether a worker task (a stop, reboot,
// start or terminate) is under way on the instance.
func operationInProgress(ctx context.Context, q store.Queries, instanceID store.InstanceID) (bool, error) {
	ts, err := q.ListTasks(ctx, store.TaskFilter{InstanceID: instanceID, Target: store.TaskTargetWorker,
		Statuses: []store.TaskStatus{store.TaskPending, store.TaskLeased, store.TaskRunning}}, store.Page{Limit: 1})
	if err != nil {
		return false, fmt.Errorf("tasks of %s: %w", instanceID, err)
	}
	return len(ts) > 0, nil
}

// guestPresent reports a machine that outlived its terminated instance and
// destroys it. The machine's own status is asked first, so a destroy that
// finished after the list was taken is not reported.
func (s *Syncer) guestPresent(ctx context.Context, p providers.Provider, in *store.Instance, m providers.Machine, res *Result) error {
	cctx, cancel := context.WithTimeout(ctx, s.timeout())
	cur, err := p.Status(cctx, m.ID)
	cancel()
	if (err == nil && cur.State == providers.StateGone) || providers.IsNotFound(err) {
		return nil
	}
	res.GuestsPresent++
	cctx, cancel = context.WithTimeout(ctx, s.timeout())
	terr := p.Terminate(cctx, m.ID)
	cancel()
	msg := fmt.Sprintf("instance is terminated but provider %s still has its machine %s (%s); destroyed it", p.Name(), m.ID, m.State)
	if terr != nil {
		msg = fmt.Sprintf("instance is terminated but provider %s still has its machine %s (%s); destroying it failed: %v (retried next sync)",
			p.Name(), m.ID, m.State, terr)
	} else {
		res.Destroyed++
	}
	now := s.Clock.Now()
	return s.Store.Tx(ctx, func(q store.Queries) error {
		_, err := events.E{Kind: events.InstanceGuestPresent, Severity: events.High, InstanceID: in.ID, Message: msg,
			Payload: events.GuestPresentPayload{Destroyed: terr == nil, Error: errText(terr), Machine: m.ID,
				Provider: p.Name(), State: string(m.State)}}.Write(ctx, q, now)
		return err
	})
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
