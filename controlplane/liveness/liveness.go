// Package liveness is the heartbeat sensor (docs/design.md §2.8): it raises
// instance.silent once per silence, and declares an instance dead only
// after asking its provider, so a machine that runs but whose agent went
// quiet (a network partition, a wedged agent) is reported, not errored.
package liveness

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/providers"
)

// Defaults (docs/design.md §2.8).
const (
	DefaultSilentAfter = 3 * time.Minute
	DefaultDeadAfter   = 10 * time.Minute
	// DefaultBootTimeout bounds a boot that makes no progress: a boot takes
	// seconds, so a quarter of an hour is a broken one.
	DefaultBootTimeout = 15 * time.Minute
	// DefaultSwitchTimeout bounds the hand-over to the root's init: the
	// agent reports switching, execs the init, and the agent that init
	// starts reconnects. A Debian root under TCG takes about a minute; a
	// root that never starts the agent must not wait out the boot timeout.
	DefaultSwitchTimeout = 3 * time.Minute
	// DefaultGrace absorbs the heartbeat flush interval and the jitter of
	// the loop itself.
	DefaultGrace = 15 * time.Second
	// DefaultMaxHeartbeatsPerSecond mirrors the agent API's rate (the
	// daemon passes api.MaxHeartbeatsPerSecond).
	DefaultMaxHeartbeatsPerSecond = 2000.0
)

// Sensor checks heartbeats.
type Sensor struct {
	Store     store.Store
	Clock     clock.Clock
	Log       *slog.Logger
	Instances *instances.Service

	// SilentAfter and DeadAfter are the thresholds of a small fleet
	// (zero: the defaults); TTL stretches both with the fleet's size.
	SilentAfter, DeadAfter time.Duration
	// Grace is added to both (zero: DefaultGrace; negative: none).
	Grace time.Duration
	// MaxHeartbeatsPerSecond is the agents' heartbeat budget
	// (zero: DefaultMaxHeartbeatsPerSecond).
	MaxHeartbeatsPerSecond float64
	// BootTimeout errors an instance that stays provisioning, starting or
	// rebooting this long without a change (zero: DefaultBootTimeout), so
	// none is left dangling in a boot that will never finish.
	BootTimeout time.Duration
	// SwitchTimeout errors a booting instance whose agent reported
	// switching and has not been heard from since for this long (zero:
	// DefaultSwitchTimeout): the root's init did not start the agent.
	SwitchTimeout time.Duration
}

// TTL is how long an agent may stay quiet in a fleet of n running
// instances before the threshold min counts as passed. Agents heartbeat at
// most every n / rate seconds when the fleet is large (api.HeartbeatInterval
// stretches their interval to keep the load bounded), so the timeout
// stretches with it: max(min, n / rate) + grace, Nomad's rule.
func TTL(min time.Duration, n int, rate float64, grace time.Duration) time.Duration {
	if rate <= 0 {
		rate = DefaultMaxHeartbeatsPerSecond
	}
	scaled := time.Duration(float64(n) / rate * float64(time.Second))
	return max(min, scaled) + grace
}

// Result counts what a tick did.
type Result struct {
	// Silent instances newly marked silent.
	Silent int
	// Dead instances errored as presumed dead.
	Dead int
	// KeptAlive instances silent past the dead threshold that their
	// provider reports running.
	KeptAlive int
	// Unknown instances whose provider could not be asked; left for the
	// next tick.
	Unknown int
	// BootTimedOut instances errored because their boot never finished.
	BootTimedOut int
	// SwitchTimedOut instances errored because no agent came back after
	// the switch into the root's init.
	SwitchTimedOut int
}

func (s *Sensor) thresholds(n int) (silent, dead time.Duration) {
	silentAfter, deadAfter, grace := s.SilentAfter, s.DeadAfter, s.Grace
	if silentAfter <= 0 {
		silentAfter = DefaultSilentAfter
	}
	if deadAfter <= 0 {
		deadAfter = DefaultDeadAfter
	}
	if grace < 0 {
		grace = 0
	} else if grace == 0 {
		grace = DefaultGrace
	}
	rate := s.MaxHeartbeatsPerSecond
	return TTL(silentAfter, n, rate, grace), TTL(deadAfter, n, rate, grace)
}

// Tick checks every running instance's heartbeat and every boot's age once.
func (s *Sensor) Tick(ctx context.Context) (Result, error) {
	var res Result
	if err := s.bootTimeouts(ctx, &res); err != nil {
		return res, err
	}
	if err := s.switchTimeouts(ctx, &res); err != nil {
		return res, err
	}
	n, err := s.Store.CountInstances(ctx, store.InstanceFilter{Statuses: []lifecycle.State{lifecycle.Running}})
	if err != nil {
		return res, fmt.Errorf("liveness: count running instances: %w", err)
	}
	silentTTL, deadTTL := s.thresholds(n)
	now := s.Clock.Now()
	before := now.Add(-silentTTL)
	page := store.Page{Limit: store.MaxPageSize}
	for {
		ins, err := s.Store.ListInstances(ctx, store.InstanceFilter{Statuses: []lifecycle.State{lifecycle.Running}, HeartbeatBefore: &before}, page)
		if err != nil {
			return res, fmt.Errorf("liveness: list silent instances: %w", err)
		}
		for _, in := range ins {
			if in.TerminateRequestedAt != nil {
				continue
			}
			if err := s.check(ctx, in, now, silentTTL, deadTTL, &res); err != nil {
				return res, err
			}
		}
		if len(ins) < page.Limit {
			return res, nil
		}
		page.After = ins[len(ins)-1].ID.String()
	}
}

func lastHeard(in *store.Instance) time.Time {
	if in.LastHeartbeatAt != nil {
		return *in.LastHeartbeatAt
	}
	return in.CreatedAt
}

func (s *Sensor) check(ctx context.Context, in *store.Instance, now time.Time, silentTTL, deadTTL time.Duration, res *Result) error {
	heard := lastHeard(in)
	if now.Sub(heard) < deadTTL {
		return s.markSilent(ctx, in.ID, heard, now, res)
	}
	// Past the dead threshold: ask the provider before declaring anything.
	p, err := s.Instances.Provider(in.Provider)
	if err != nil {
		res.Unknown++
		s.Log.Warn("liveness: cannot ask the provider of a silent instance", "instance", in.ID, "err", err)
		return s.markSilent(ctx, in.ID, heard, now, res)
	}
	machine := in.CloudInstanceID
	var m providers.Machine
	if machine != "" {
		m, err = p.Status(ctx, machine)
	} else {
		m.State = providers.StateGone
	}
	switch {
	case err != nil && !providers.IsNotFound(err):
		res.Unknown++
		s.Log.Warn("liveness: provider status failed; not declaring a silent instance dead", "instance", in.ID, "err", err)
		return s.markSilent(ctx, in.ID, heard, now, res)
	case err == nil && m.State == providers.StateRunning:
		res.KeptAlive++
		return s.markSilent(ctx, in.ID, heard, now, res)
	}
	if err != nil {
		m.State = providers.StateGone
	}
	return s.presumeDead(ctx, in.ID, heard, now, m.State, res)
}

// markSilent raises instance.silent once per silence: silent_since is set
// here and cleared by the next heartbeat.
func (s *Sensor) markSilent(ctx context.Context, id store.InstanceID, heard, now time.Time, res *Result) error {
	// Tx may run fn again (a lost deadlock): count what committed.
	n := 0
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		n = 0
		in, err := q.LockInstance(ctx, id)
		if err != nil {
			return err
		}
		if in.SilentSince != nil || in.Status != lifecycle.Running || lastHeard(in).After(heard) {
			return nil
		}
		in.SilentSince, in.UpdatedAt = &now, now
		if err := q.UpdateInstance(ctx, in); err != nil {
			return err
		}
		n++
		_, err = events.E{Kind: events.InstanceSilent, Severity: events.Medium, InstanceID: id,
			Message: fmt.Sprintf("no heartbeat since %s (%s)", heard.UTC().Format(time.RFC3339), now.Sub(heard).Round(time.Second)),
			Payload: events.SilentPayload{LastHeartbeatAt: heard.UTC().Format(time.RFC3339)}}.Write(ctx, q, now)
		return err
	})
	if err == nil {
		res.Silent += n
	}
	return err
}

func (s *Sensor) presumeDead(ctx context.Context, id store.InstanceID, heard, now time.Time, observed providers.MachineState, res *Result) error {
	// Tx may run fn again (a lost deadlock): count what committed.
	n := 0
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		n = 0
		in, err := q.LockInstance(ctx, id)
		if err != nil {
			return err
		}
		if in.Status != lifecycle.Running || lastHeard(in).After(heard) || in.TerminateRequestedAt != nil {
			return nil
		}
		reason := fmt.Sprintf("presumed dead: no heartbeat since %s (%s); provider %s reports the machine %s",
			heard.UTC().Format(time.RFC3339), now.Sub(heard).Round(time.Second), in.Provider, observed)
		in.ErrorMessage = reason
		if in.SilentSince == nil {
			in.SilentSince = &now
		}
		if err := s.Instances.TransitionTx(ctx, q, in, lifecycle.MarkErrored, reason, now); err != nil {
			return err
		}
		n++
		_, err = events.E{Kind: events.InstancePresumedDead, Severity: events.High, InstanceID: id, Message: reason,
			Payload: events.PresumedDeadPayload{LastHeartbeatAt: heard.UTC().Format(time.RFC3339), Observed: string(observed)}}.Write(ctx, q, now)
		return err
	})
	if err == nil {
		res.Dead += n
	}
	return err
}

var booting = []lifecycle.State{lifecycle.Provisioning, lifecycle.Starting, lifecycle.Rebooting}

// bootTimeouts errors instances whose boot has made no progress (no row
// change: a transition, an agent error) for BootTimeout. Warming pool
// members are the pool reaper's: it replaces them on a shorter timeout.
func (s *Sensor) bootTimeouts(ctx context.Context, res *Result) error {
	limit := s.BootTimeout
	if limit <= 0 {
		limit = DefaultBootTimeout
	}
	now := s.Clock.Now()
	// Only rows past the limit are read: a mass boot keeps thousands of
	// instances booting, and listing all of them every tick was a third
	// of tetherd's CPU while 40,000 enrolled at once.
	cutoff := now.Add(-limit)
	return s.eachBooting(ctx, store.InstanceFilter{Statuses: booting, UpdatedBefore: &cutoff}, "booting", true, func(id store.InstanceID) error {
		return s.timeOut(ctx, id, limit, now, res)
	})
}

// eachBooting calls fn for every booting instance that f selects, page by
// page, except those a terminate owns and, with skipWarming, the warming
// pool members the pool reaper times out itself.
func (s *Sensor) eachBooting(ctx context.Context, f store.InstanceFilter, what string, skipWarming bool, fn func(id store.InstanceID) error) error {
	page := store.Page{Limit: store.MaxPageSize}
	for {
		ins, err := s.Store.ListInstances(ctx, f, page)
		if err != nil {
			return fmt.Errorf("liveness: list %s instances: %w", what, err)
		}
		for _, in := range ins {
			if in.TerminateRequestedAt != nil || (skipWarming && in.PoolState == lifecycle.PoolWarming) {
				continue
			}
			if err := fn(in.ID); err != nil {
				return err
			}
		}
		if len(ins) < page.Limit {
			return nil
		}
		page.After = ins[len(ins)-1].ID.String()
	}
}

func (s *Sensor) timeOut(ctx context.Context, id store.InstanceID, limit time.Duration, now time.Time, res *Result) error {
	// Tx may run fn again (a lost deadlock): count what committed.
	n := 0
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		n = 0
		in, err := q.LockInstance(ctx, id)
		if err != nil {
			return err
		}
		if !slices.Contains(booting, in.Status) || in.TerminateRequestedAt != nil || now.Sub(in.UpdatedAt) < limit {
			return nil // it moved on meanwhile
		}
		phase := in.AgentPhase
		if phase == "" {
			phase = "none (the agent never reported)"
		}
		reason := fmt.Sprintf("boot did not finish: %s for %s with no progress; last agent phase %s", in.Status, limit, phase)
		if in.AgentError != "" {
			reason += "; agent error: " + in.AgentError
		}
		in.ErrorMessage = reason
		if err := s.Instances.TransitionTx(ctx, q, in, lifecycle.MarkErrored, reason, now); err != nil {
			return err
		}
		n++
		_, err = events.E{Kind: events.InstanceBootTimeout, Severity: events.High, InstanceID: id, Message: reason,
			Payload: events.BootTimeoutPayload{AgentError: in.AgentError, AgentPhase: in.AgentPhase, Status: in.Status}}.Write(ctx, q, now)
		return err
	})
	if err == nil {
		res.BootTimedOut += n
	}
	return err
}

// switchPhase is the agent phase the switching heartbeat stores.
const switchPhase = "switching"

// switchTimeouts errors booting instances whose agent reported switching
// and went quiet for SwitchTimeout: the exec of the root's init ended the
// agent, and nothing in the root started the next one (docs/design.md
// §2.3). The switching heartbeat is the agent's last before the exec, so
// its time is the start of the hand-over.
func (s *Sensor) switchTimeouts(ctx context.Context, res *Result) error {
	limit := s.SwitchTimeout
	if limit <= 0 {
		limit = DefaultSwitchTimeout
	}
	now := s.Clock.Now()
	cutoff := now.Add(-limit)
	// Only rows in the phase and past the limit are read: a mass boot
	// keeps thousands of instances booting and quiet a while.
	f := store.InstanceFilter{Statuses: booting, HeartbeatBefore: &cutoff, AgentPhase: switchPhase}
	// Warming pool members too: the pool's warming timeout (10 min by
	// default) would replace one whose root starts no agent later, and
	// without saying why; errored, the reaper replaces it on its next tick.
	return s.eachBooting(ctx, f, "switching", false, func(id store.InstanceID) error {
		return s.switchTimeOut(ctx, id, limit, now, res)
	})
}

func (s *Sensor) switchTimeOut(ctx context.Context, id store.InstanceID, limit time.Duration, now time.Time, res *Result) error {
	n := 0
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		n = 0
		in, err := q.LockInstance(ctx, id)
		if err != nil {
			return err
		}
		if !slices.Contains(booting, in.Status) || in.TerminateRequestedAt != nil || in.AgentPhase != switchPhase ||
			in.LastHeartbeatAt == nil || now.Sub(*in.LastHeartbeatAt) < limit {
			return nil // it moved on meanwhile
		}
		reason := fmt.Sprintf("the agent did not come back after switching into the root's init: no heartbeat for %s since it reported switching; "+
			"the root's init must start /run/tether/bin/tether-agent (a systemd root does so from the unit the agent writes; any other init needs the hook examples/root shows), see the instance console", limit)
		in.ErrorMessage = reason
		if err := s.Instances.TransitionTx(ctx, q, in, lifecycle.MarkErrored, reason, now); err != nil {
			return err
		}
		n++
		_, err = events.E{Kind: events.InstanceBootTimeout, Severity: events.High, InstanceID: id, Message: reason,
			Payload: events.SwitchTimeoutPayload{AgentPhase: in.AgentPhase, Status: in.Status, SwitchTimeout: limit.String()}}.Write(ctx, q, now)
		return err
	})
	if err == nil {
		res.SwitchTimedOut += n
	}
	return err
}
