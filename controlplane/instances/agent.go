package instances

import (
	"context"
	"fmt"
	"strings"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
)

// ReadyHook runs in the transaction that records an agent's first
// phase=ready heartbeat (the pool service moves warming members to ready).
// It runs only for an instance that is booting or a pool member still
// warming (readyMatters): a hook must not need any other.
type ReadyHook func(ctx context.Context, q store.Queries, in *store.Instance) error

// readyMatters says whether a ready report can change in: it is booting,
// or a pool member not yet moved to ready.
func readyMatters(in *store.Instance) bool {
	switch in.Status {
	case lifecycle.Provisioning, lifecycle.Starting, lifecycle.Rebooting:
		return true
	}
	return in.PoolID != "" && in.PoolState == lifecycle.PoolWarming
}

// AgentReady handles a phase=ready heartbeat: a booting instance
// (provisioning, starting, rebooting) becomes running.
//
// Every agent that reconnects reports ready on its new stream, and for
// almost all of them (running, not warming) nothing changes. A read
// decides that first: taking the write transaction anyway put each of
// the 19,000 reconnections after a tetherd restart through SQLite's one
// writer, and the reads of the connections behind them waited for it
// (docs/reliability.md, reconnect storm). The read may be stale only in
// a way the next boot repairs: an instance rebooted after it is read
// reports ready again from its new boot.
func (s *Service) AgentReady(ctx context.Context, instanceID store.InstanceID, hooks ...ReadyHook) error {
	in, err := s.Store.GetInstance(ctx, instanceID)
	if err != nil {
		return err
	}
	return s.AgentReadyAsSeen(ctx, in, hooks...)
}

// AgentReadyAsSeen is AgentReady for a caller that has just read the
// instance (a stream reads it when it opens, and its agent reports ready
// right after): seen decides whether to take the transaction, which reads
// the row again under its lock.
func (s *Service) AgentReadyAsSeen(ctx context.Context, seen *store.Instance, hooks ...ReadyHook) error {
	if !readyMatters(seen) {
		return nil
	}
	instanceID := seen.ID
	return s.Store.Tx(ctx, func(q store.Queries) error {
		in, err := q.LockInstance(ctx, instanceID)
		if err != nil {
			return err
		}
		now := s.Clock.Now()
		switch in.Status {
		case lifecycle.Provisioning, lifecycle.Starting, lifecycle.Rebooting:
			// last_heartbeat_at belongs to the heartbeat batch: stamping it
			// here with a later time made the batch's never-go-backwards
			// guard drop the ready heartbeat's modules and version.
			in.AgentPhase, in.ErrorMessage = "ready", ""
			if err := s.transition(ctx, q, in, lifecycle.MarkRunning, "agent reported ready", now); err != nil {
				return err
			}
			if _, err := (events.E{Kind: events.InstanceRunning, InstanceID: in.ID,
				Message: fmt.Sprintf("instance is running (agent %s)", in.AgentVersion)}).Write(ctx, q, now); err != nil {
				return err
			}
		}
		for _, h := range hooks {
			if err := h(ctx, q, in); err != nil {
				return err
			}
		}
		return nil
	})
}

// AgentError records a new error an agent reported (a module digest
// mismatch, a mount failure): shown on the instance and in the event log.
func (s *Service) AgentError(ctx context.Context, instanceID store.InstanceID, phase, msg string) error {
	now := s.Clock.Now()
	return s.Store.Tx(ctx, func(q store.Queries) error {
		in, err := q.LockInstance(ctx, instanceID)
		if err != nil {
			return err
		}
		in.AgentError, in.UpdatedAt = msg, now
		if err := q.UpdateInstance(ctx, in); err != nil {
			return err
		}
		kind := events.InstanceAgentError
		// A node refusing a module's signature says so in the error's
		// first word (agent/modules.SignatureRefused); it gets its own kind
		// so it can be watched for.
		if strings.HasPrefix(msg, events.ModuleSignatureRefused.String()+": ") {
			kind = events.ModuleSignatureRefused
		}
		_, err = events.E{Kind: kind, Severity: events.High, InstanceID: instanceID,
			Message: fmt.Sprintf("agent reports (phase %s): %s", phase, msg), Payload: events.AgentErrorPayload{Error: msg, Phase: phase}}.Write(ctx, q, now)
		return err
	})
}

// AgentGaveUp records an agent error that ended the boot (the heartbeat's
// boot_failed: retrying cannot fix it, e.g. the node's memory cannot hold
// its modules) and errors a booting instance at once with the agent's
// words as the reason, rather than leaving it to the boot timeout. An
// instance past its boot (running, stopping) only gets the error recorded.
func (s *Service) AgentGaveUp(ctx context.Context, instanceID store.InstanceID, phase, msg string) error {
	now := s.Clock.Now()
	return s.Store.Tx(ctx, func(q store.Queries) error {
		in, err := q.LockInstance(ctx, instanceID)
		if err != nil {
			return err
		}
		in.AgentError, in.UpdatedAt = msg, now
		switch in.Status {
		case lifecycle.Provisioning, lifecycle.Starting, lifecycle.Rebooting:
		default:
			return q.UpdateInstance(ctx, in)
		}
		if in.TerminateRequestedAt != nil {
			return q.UpdateInstance(ctx, in)
		}
		reason := fmt.Sprintf("the agent gave up the boot (phase %s): %s", phase, msg)
		in.ErrorMessage = reason
		if err := s.transition(ctx, q, in, lifecycle.MarkErrored, reason, now); err != nil {
			return err
		}
		_, err = events.E{Kind: events.InstanceErrored, Severity: events.High, InstanceID: instanceID, Message: reason,
			Payload: events.AgentErrorPayload{Error: msg, Phase: phase}}.Write(ctx, q, now)
		return err
	})
}

// Readiness is what the agent API calls on an agent's ready report: the
// instance service with the hooks the composition root chose (pool
// membership), so the API holds no pool type and no list of hooks.
type Readiness struct {
	Instances *Service
	Hooks     []ReadyHook
}

// AgentReady is Service.AgentReady with r's hooks.
func (r Readiness) AgentReady(ctx context.Context, instanceID store.InstanceID) error {
	return r.Instances.AgentReady(ctx, instanceID, r.Hooks...)
}

// AgentReadyAsSeen is Service.AgentReadyAsSeen with r's hooks.
func (r Readiness) AgentReadyAsSeen(ctx context.Context, seen *store.Instance) error {
	return r.Instances.AgentReadyAsSeen(ctx, seen, r.Hooks...)
}
