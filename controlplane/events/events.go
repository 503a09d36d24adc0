// Package events writes and reads the fleet event log (docs/design.md §7): append-only,
// each event with kind, severity, ids, correlation id and payload.
package events

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
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
	EnrollSucceeded   store.EventKind = "enroll.succeeded"
	EnrollTokenReused store.EventKind = "enroll.token_reused"
	// EnrollRetried: a spent token presented again for the key it was
	// spent for, answered with a certificate for that key again.
	EnrollRetried store.EventKind = "enroll.retried"
	EnrollRefused store.EventKind = "enroll.refused"
	// EnrollEKMismatch is an attested enrollment whose TPM is not the one
	// bound to the node: another node's EK, or a new TPM on a node that
	// has one registered. High severity; the payload names every hash.
	EnrollEKMismatch store.EventKind = "enroll.ek_mismatch"
	CertRenewed      store.EventKind = "certificate.renewed"
	CertRevoked      store.EventKind = "certificate.revoked"
	CertIssued       store.EventKind = "certificate.issued"
	// CA rotation (design §3.10).
	CAPrepared  store.EventKind = "ca.prepared"
	CAActivated store.EventKind = "ca.activated"
	CARetired   store.EventKind = "ca.retired"
	CAAdopted   store.EventKind = "ca.adopted"
	TokenIssued store.EventKind = "token.issued"
	// NodeMACGenerated records a hardware address the control plane made
	// up for a netbooting machine of a node that had none.
	NodeMACGenerated store.EventKind = "node.mac_generated"
	// BMCTLSUnverified records each use of a BMC whose TLS certificate is
	// not verified (--bmc-insecure-skip-verify).
	BMCTLSUnverified store.EventKind = "bmc.tls_unverified"

	InstanceProvisioned     store.EventKind = "instance.provisioned"
	InstanceTransition      store.EventKind = "instance.transition"
	InstanceRunning         store.EventKind = "instance.running"
	InstanceErrored         store.EventKind = "instance.errored"
	InstanceAgentError      store.EventKind = "instance.agent_error"
	InstanceSilent          store.EventKind = "instance.silent"
	InstancePresumedDead    store.EventKind = "instance.presumed_dead"
	InstanceBootTimeout     store.EventKind = "instance.boot_timeout"
	InstanceTerminated      store.EventKind = "instance.terminated"
	InstanceTerminateFailed store.EventKind = "instance.terminate_failed"
	InstanceGuestPresent    store.EventKind = "instance.terminated_guest_present"
	InstanceProviderFailed  store.EventKind = "instance.provider_failed"
	InstanceCordoned        store.EventKind = "instance.cordoned"
	InstanceUncordoned      store.EventKind = "instance.uncordoned"
	InstanceHeld            store.EventKind = "instance.held"
	InstanceUnheld          store.EventKind = "instance.unheld"
	// InstanceTerminateRequested records a terminate's intent (phase one
	// of two), so an interrupted terminate is findable and resumable.
	InstanceTerminateRequested store.EventKind = "instance.terminate_requested"
	// InstanceMachineCreated records the provider's machine id for an
	// instance once a provision took effect.
	InstanceMachineCreated store.EventKind = "instance.machine_created"
	// InstanceProviderAnswerLost records a provider call that reported a
	// failure although the observed state shows it took effect.
	InstanceProviderAnswerLost store.EventKind = "instance.provider_answer_lost"
	// InstanceMachineDestroyed records a machine destroyed because its
	// instance was terminated while the machine was being created.
	InstanceMachineDestroyed store.EventKind = "instance.machine_destroyed"

	NetbootServed  store.EventKind = "netboot.script_served"
	NetbootRefused store.EventKind = "netboot.script_refused"

	TaskCreated  store.EventKind = "task.created"
	TaskFinished store.EventKind = "task.finished"
	TaskRefused  store.EventKind = "task.update_refused"

	// ControlPlaneRestored: the first start on a data dir rebuilt from a
	// backup; what was written after the backup is lost.
	ControlPlaneRestored store.EventKind = "controlplane.restored"

	ModulePushed       store.EventKind = "module.pushed"
	ModuleDeleted      store.EventKind = "module.deleted"
	ModuleFetchRefused store.EventKind = "module.fetch_refused"
	ModuleSigned       store.EventKind = "module.signed"
	// ModuleSignatureRefused: a node refused a module its signer anchor or
	// its template's required signers do not cover.
	ModuleSignatureRefused store.EventKind = "module.signature_refused"

	PoolMemberReady           store.EventKind = "pool.member_ready"
	PoolClaimed               store.EventKind = "pool.claimed"
	PoolReleased              store.EventKind = "pool.released"
	PoolClaimedStale          store.EventKind = "pool.claimed_stale"
	PoolClaimedStaleHeartbeat store.EventKind = "pool.claimed_stale_heartbeat_flagged"
	PoolReadyStaleHeartbeat   store.EventKind = "pool.ready_stale_heartbeat_recycled"
	PoolTerminateFailed       store.EventKind = "pool.terminate_failed"
	PoolTerminateAbandoned    store.EventKind = "pool.terminate_abandoned"
	PoolRecycleWithheld       store.EventKind = "pool.recycle_withheld"
)

// kinds is the vocabulary: every kind the control plane writes.
var kinds = []store.EventKind{
	EnrollSucceeded, EnrollTokenReused, EnrollRetried, EnrollRefused, EnrollEKMismatch, CertRenewed, CertRevoked,
	CertIssued, CAPrepared, CAActivated, CARetired, CAAdopted, TokenIssued, NodeMACGenerated,
	BMCTLSUnverified, InstanceProvisioned, InstanceTransition, InstanceRunning, InstanceErrored,
	InstanceAgentError, InstanceSilent, InstancePresumedDead, InstanceBootTimeout, InstanceTerminated,
	InstanceTerminateFailed, InstanceGuestPresent, InstanceProviderFailed, InstanceCordoned,
	InstanceUncordoned, InstanceHeld, InstanceUnheld, InstanceTerminateRequested,
	InstanceMachineCreated, InstanceProviderAnswerLost, InstanceMachineDestroyed, NetbootServed,
	NetbootRefused, TaskCreated, TaskFinished, TaskRefused, ControlPlaneRestored, ModulePushed,
	ModuleDeleted, ModuleFetchRefused, ModuleSigned, ModuleSignatureRefused, PoolMemberReady,
	PoolClaimed, PoolReleased, PoolClaimedStale, PoolClaimedStaleHeartbeat, PoolReadyStaleHeartbeat,
	PoolTerminateFailed, PoolTerminateAbandoned, PoolRecycleWithheld, NetbootMachineRefused,
	NetbootUKIServed, NetbootAnnounced, NodeAdopted, NodeEKConflict,
}

// Kinds returns every kind the control plane writes.
func Kinds() []store.EventKind { return slices.Clone(kinds) }

// ParseKind converts text into a kind of the vocabulary. Writers are
// checked against it (Write refuses a kind outside it, a programming
// error); the store keeps any kind, so that an older or newer replica's
// events still read.
func ParseKind(s string) (store.EventKind, error) {
	if k := store.EventKind(s); slices.Contains(kinds, k) {
		return k, nil
	}
	return "", fmt.Errorf("%w: event kind %q", store.ErrUnknownValue, s)
}

// E describes an event to write.
type E struct {
	Kind          store.EventKind
	Severity      store.Severity
	InstanceID    store.InstanceID
	PoolID        store.PoolID
	CorrelationID store.CorrelationID
	Message       string
	// Payload is the kind's payload (payload.go); nil stores {}.
	Payload Payload
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
	if _, err := ParseKind(string(e.Kind)); err != nil {
		return nil, fmt.Errorf("write event: %w", err)
	}
	payload := []byte("{}")
	if e.Payload != nil {
		b, err := json.Marshal(e.Payload)
		if err != nil {
			return nil, fmt.Errorf("event %s payload: %w", e.Kind, err)
		}
		// A nil pointer to a payload struct is no payload, as a nil map was.
		if string(b) != "null" {
			payload = b
		}
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
