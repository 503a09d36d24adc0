// Package events writes and reads the fleet event log (docs/design.md §7): append-only,
// each event with kind, severity, ids, correlation id and payload.
package events

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
)

// Severities.
const (
	Low      = store.SeverityLow
	Medium   = store.SeverityMedium
	High     = store.SeverityHigh
	Critical = store.SeverityCritical
)

// Event kinds written by the control plane. Pool kinds follow docs/design.md §4.10.
const (
	EnrollSucceeded   = "enroll.succeeded"
	EnrollTokenReused = "enroll.token_reused"
	EnrollRefused     = "enroll.refused"
	// EnrollEKMismatch is an attested enrollment whose TPM is not the one
	// bound to the node: another node's EK, or a new TPM on a node that
	// has one registered. High severity; the payload names every hash.
	EnrollEKMismatch = "enroll.ek_mismatch"
	CertRenewed      = "certificate.renewed"
	CertRevoked      = "certificate.revoked"
	CertIssued       = "certificate.issued"
	// CA rotation (design §3.10).
	CAPrepared  = "ca.prepared"
	CAActivated = "ca.activated"
	CARetired   = "ca.retired"
	CAAdopted   = "ca.adopted"
	TokenIssued = "token.issued"
	// NodeMACGenerated records a hardware address the control plane made
	// up for a netbooting machine of a node that had none.
	NodeMACGenerated = "node.mac_generated"
	// BMCTLSUnverified records each use of a BMC whose TLS certificate is
	// not verified (--bmc-insecure-skip-verify).
	BMCTLSUnverified = "bmc.tls_unverified"

	InstanceProvisioned     = "instance.provisioned"
	InstanceTransition      = "instance.transition"
	InstanceRunning         = "instance.running"
	InstanceErrored         = "instance.errored"
	InstanceAgentError      = "instance.agent_error"
	InstanceSilent          = "instance.silent"
	InstancePresumedDead    = "instance.presumed_dead"
	InstanceBootTimeout     = "instance.boot_timeout"
	InstanceTerminated      = "instance.terminated"
	InstanceTerminateFailed = "instance.terminate_failed"
	InstanceGuestPresent    = "instance.terminated_guest_present"
	InstanceProviderFailed  = "instance.provider_failed"
	InstanceCordoned        = "instance.cordoned"
	InstanceUncordoned      = "instance.uncordoned"
	InstanceHeld            = "instance.held"
	InstanceUnheld          = "instance.unheld"
	// InstanceTerminateRequested records a terminate's intent (phase one
	// of two), so an interrupted terminate is findable and resumable.
	InstanceTerminateRequested = "instance.terminate_requested"
	// InstanceMachineCreated records the provider's machine id for an
	// instance once a provision took effect.
	InstanceMachineCreated = "instance.machine_created"
	// InstanceProviderAnswerLost records a provider call that reported a
	// failure although the observed state shows it took effect.
	InstanceProviderAnswerLost = "instance.provider_answer_lost"
	// InstanceMachineDestroyed records a machine destroyed because its
	// instance was terminated while the machine was being created.
	InstanceMachineDestroyed = "instance.machine_destroyed"

	NetbootServed  = "netboot.script_served"
	NetbootRefused = "netboot.script_refused"

	TaskCreated  = "task.created"
	TaskFinished = "task.finished"
	TaskRefused  = "task.update_refused"

	// ControlPlaneRestored: the first start on a data dir rebuilt from a
	// backup; what was written after the backup is lost.
	ControlPlaneRestored = "controlplane.restored"

	ModulePushed       = "module.pushed"
	ModuleDeleted      = "module.deleted"
	ModuleFetchRefused = "module.fetch_refused"
	ModuleSigned       = "module.signed"
	// ModuleSignatureRefused: a node refused a module its signer anchor or
	// its template's required signers do not cover.
	ModuleSignatureRefused = "module.signature_refused"

	PoolMemberReady           = "pool.member_ready"
	PoolClaimed               = "pool.claimed"
	PoolReleased              = "pool.released"
	PoolClaimedStale          = "pool.claimed_stale"
	PoolClaimedStaleHeartbeat = "pool.claimed_stale_heartbeat_flagged"
	PoolReadyStaleHeartbeat   = "pool.ready_stale_heartbeat_recycled"
	PoolTerminateFailed       = "pool.terminate_failed"
	PoolTerminateAbandoned    = "pool.terminate_abandoned"
	PoolRecycleWithheld       = "pool.recycle_withheld"
)

// E describes an event to write.
type E struct {
	Kind          string
	Severity      int
	InstanceID    string
	PoolID        string
	CorrelationID string
	Message       string
	Payload       map[string]any
}

// Write appends e through q (so it commits or rolls back with the caller's
// transaction) and returns the stored event.
func (e E) Write(ctx context.Context, q store.EventQueries, now time.Time) (*store.Event, error) {
	ev, err := e.event(now)
	if err != nil {
		return nil, err
	}
	if err := q.AppendEvent(ctx, ev); err != nil {
		return nil, err
	}
	return ev, nil
}

func (e E) event(now time.Time) (*store.Event, error) {
	payload := []byte("{}")
	if len(e.Payload) > 0 {
		b, err := json.Marshal(e.Payload)
		if err != nil {
			return nil, fmt.Errorf("event %s payload: %w", e.Kind, err)
		}
		payload = b
	}
	sev := e.Severity
	if sev == 0 {
		sev = Low
	}
	return &store.Event{Kind: e.Kind, Severity: sev, InstanceID: e.InstanceID, PoolID: e.PoolID,
		CorrelationID: e.CorrelationID, Message: e.Message, Payload: payload, CreatedAt: now}, nil
}

// WriteAll appends es through q in order with one notification (see
// store.Queries.AppendEvents) and returns the stored events.
func WriteAll(ctx context.Context, q store.EventQueries, now time.Time, es ...E) ([]*store.Event, error) {
	out := make([]*store.Event, 0, len(es))
	for _, e := range es {
		ev, err := e.event(now)
		if err != nil {
			return nil, err
		}
		out = append(out, ev)
	}
	if err := q.AppendEvents(ctx, out); err != nil {
		return nil, err
	}
	return out, nil
}

// Watch sends every event matching f with an id above after, oldest
// first, until ctx ends or send fails. It wakes on notifications from any
// replica and also polls, so a dropped notification only delays delivery.
func Watch(ctx context.Context, s store.Store, f store.EventFilter, after int64, poll time.Duration, send func(*store.Event) error) error {
	ch, stop := s.Subscribe(store.ChannelEvents)
	defer stop()
	// The safety-net poll is mechanism, on the wall clock: it only bounds
	// how late a dropped notification's events arrive.
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		for {
			evs, err := s.ListEventsSince(ctx, f, after, 500)
			if err != nil {
				return err
			}
			for _, e := range evs {
				if err := send(e); err != nil {
					return err
				}
				after = e.ID
			}
			if len(evs) < 500 {
				break
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case id := <-ch:
			// Skip the read when the notified event is one we have sent.
			if n, err := strconv.ParseInt(id, 10, 64); err == nil && n <= after {
				continue
			}
		case <-t.C:
		}
	}
}
