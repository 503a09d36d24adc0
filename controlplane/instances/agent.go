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
type ReadyHook func(ctx context.Context, q store.Queries, in *store.Instance) error

// AgentReady handles a phase=ready heartbeat: a booting instance
// (provisioning, starting, rebooting) becomes running.
func (s *Service) AgentReady(ctx context.Context, instanceID string, hooks ...ReadyHook) error {
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
func (s *Service) AgentError(ctx context.Context, instanceID, phase, msg string) error {
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
		if strings.HasPrefix(msg, events.ModuleSignatureRefused+": ") {
			kind = events.ModuleSignatureRefused
		}
		_, err = events.E{Kind: kind, Severity: events.High, InstanceID: instanceID,
			Message: fmt.Sprintf("agent reports (phase %s): %s", phase, msg), Payload: map[string]any{"phase": phase, "error": msg}}.Write(ctx, q, now)
		return err
	})
}
