package instances

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
)

// Cordon results (docs/design.md §2.9).
const (
	CordonFenced        = "fenced"
	CordonClaimed       = "claimed"
	CordonAlreadyFenced = "already_fenced"
	CordonNotPooled     = "not_pooled"
	// CordonAlreadyCordoned is drain's answer for an instance an earlier
	// cordon marked: the cordon half is done, so the drain goes on to stop.
	CordonAlreadyCordoned = "already_cordoned"

	UncordonRestored = "restored"
	UncordonCleared  = "cleared"
	// UncordonNotCordoned answers an uncordon of an instance with no
	// marker: already where the caller wants it, nothing changed.
	UncordonNotCordoned = "not_cordoned"
)

const maxReason = 1024

func checkReason(reason string) error {
	switch {
	case strings.TrimSpace(reason) == "":
		return fail.Invalid("reason", "required: say why (it is recorded on the instance and in the event)")
	case len(reason) > maxReason:
		return fail.Invalid("reason", "longer than %d characters", maxReason)
	}
	return nil
}

// mutate runs fn on a locked, not terminated instance in one transaction.
func (s *Service) mutate(ctx context.Context, id store.InstanceID, what string, fn func(q store.Queries, in *store.Instance, now time.Time) error) (*store.Instance, error) {
	if id == "" {
		return nil, fail.Invalid("id", "required")
	}
	now := s.Clock.Now()
	var in *store.Instance
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		var err error
		if in, err = q.LockInstance(ctx, id); err != nil {
			return err
		}
		if in.Status.Terminal() {
			return fail.Precondition("instance %s is terminated; it cannot be %s", id, what)
		}
		return fn(q, in, now)
	})
	if err != nil {
		return nil, err
	}
	return in, nil
}

// Hold places an ops hold: start, reboot and terminate are refused until
// Unhold, by every caller (no force overrides it); stop still works.
// Holding a held instance changes nothing.
func (s *Service) Hold(ctx context.Context, id store.InstanceID, reason, by string) (*store.Instance, error) {
	if err := checkReason(reason); err != nil {
		return nil, err
	}
	return s.mutate(ctx, id, "held", func(q store.Queries, in *store.Instance, now time.Time) error {
		if in.Hold {
			return nil
		}
		in.Hold, in.HoldReason, in.UpdatedAt = true, reason, now
		if err := q.UpdateInstance(ctx, in); err != nil {
			return err
		}
		_, err := events.E{Kind: events.InstanceHeld, Severity: events.Medium, InstanceID: in.ID,
			Message: fmt.Sprintf("ops hold by %s: %s", by, reason), Payload: events.HeldPayload{By: by, Reason: reason}}.Write(ctx, q, now)
		return err
	})
}

// Unhold clears an ops hold; an instance without one is left as it is.
func (s *Service) Unhold(ctx context.Context, id store.InstanceID, by string) (*store.Instance, error) {
	return s.mutate(ctx, id, "unheld", func(q store.Queries, in *store.Instance, now time.Time) error {
		if !in.Hold {
			return nil
		}
		was := in.HoldReason
		in.Hold, in.HoldReason, in.UpdatedAt = false, "", now
		if err := q.UpdateInstance(ctx, in); err != nil {
			return err
		}
		_, err := events.E{Kind: events.InstanceUnheld, Severity: events.Medium, InstanceID: in.ID,
			Message: fmt.Sprintf("ops hold lifted by %s (was: %s)", by, was), Payload: events.UnheldPayload{By: by, Was: was}}.Write(ctx, q, now)
		return err
	})
}

// Cordon marks an instance unschedulable and leaves it running (docs/design.md §2.9).
// A ready pool member is fenced to draining under the row lock, so a
// member claimed a moment earlier is recorded as claimed, not clobbered.
func (s *Service) Cordon(ctx context.Context, id store.InstanceID, reason, by string) (*store.Instance, string, error) {
	if err := checkReason(reason); err != nil {
		return nil, "", err
	}
	var result string
	in, err := s.mutate(ctx, id, "cordoned", func(q store.Queries, in *store.Instance, now time.Time) error {
		var err error
		result, err = s.cordon(ctx, q, in, reason, by, now)
		return err
	})
	if err == nil && result == CordonFenced {
		s.memberLeft(in)
	}
	return in, result, err
}

func (s *Service) cordon(ctx context.Context, q store.Queries, in *store.Instance, reason, by string, now time.Time) (string, error) {
	if c := in.Cordon; c != nil {
		return "", fail.Precondition("instance %s is already cordoned (by %s at %s: %s); uncordon it first",
			in.ID, c.By, c.At.UTC().Format(time.RFC3339), c.Reason)
	}
	result := CordonNotPooled
	if in.PoolID != "" {
		switch in.PoolState {
		case lifecycle.PoolWarming:
			return "", fail.Precondition("instance %s is a warming pool member: it is not acquirable yet, so there is nothing to cordon", in.ID)
		case lifecycle.PoolErrored:
			return "", fail.Precondition("instance %s is an errored pool member: it is already on its way out", in.ID)
		case lifecycle.PoolReady:
			result = CordonFenced
		case lifecycle.PoolClaimed:
			// Marker only: release paths expect claimed, and a claimed
			// member is not acquirable anyway.
			result = CordonClaimed
		case lifecycle.PoolDraining:
			result = CordonAlreadyFenced
		}
	}
	in.Cordon = &store.Cordon{By: by, Reason: reason, At: now, PoolStateBefore: in.PoolState}
	if result == CordonFenced {
		in.PoolState = lifecycle.PoolDraining
	}
	in.UpdatedAt = now
	if err := q.UpdateInstance(ctx, in); err != nil {
		return "", err
	}
	_, err := events.E{Kind: events.InstanceCordoned, InstanceID: in.ID, PoolID: in.PoolID,
		Message: fmt.Sprintf("cordoned by %s (%s): %s", by, result, reason),
		Payload: events.CordonedPayload{By: by, CordonState: result, PoolStateBefore: in.Cordon.PoolStateBefore, Reason: reason}}.Write(ctx, q, now)
	return result, err
}

// Uncordon clears the marker. A member this cordon fenced that is still
// draining and running goes back to ready with a fresh TTL anchor
// (restored); a fenced member that is not running is refused, since a
// ready member must be a live one; otherwise the marker is just cleared.
func (s *Service) Uncordon(ctx context.Context, id store.InstanceID, by string) (*store.Instance, string, error) {
	result := UncordonNotCordoned
	in, err := s.mutate(ctx, id, "uncordoned", func(q store.Queries, in *store.Instance, now time.Time) error {
		c := in.Cordon
		if c == nil {
			return nil
		}
		result = UncordonCleared
		if in.PoolID != "" && c.PoolStateBefore == lifecycle.PoolReady && in.PoolState == lifecycle.PoolDraining {
			if in.Status != lifecycle.Running {
				return fail.Precondition("instance %s was fenced by this cordon but is %s: a ready member must be running; start it, then uncordon",
					in.ID, in.Status)
			}
			result = UncordonRestored
			in.PoolState, in.PoolReadyAt = lifecycle.PoolReady, &now
		}
		in.Cordon, in.UpdatedAt = nil, now
		if err := q.UpdateInstance(ctx, in); err != nil {
			return err
		}
		_, err := events.E{Kind: events.InstanceUncordoned, InstanceID: in.ID, PoolID: in.PoolID,
			Message: fmt.Sprintf("uncordoned by %s (%s); the cordon was: %s", by, result, c.Reason),
			Payload: events.UncordonedPayload{By: by, UncordonState: result, Was: c.Reason}}.Write(ctx, q, now)
		return err
	})
	if err != nil {
		return nil, "", err
	}
	return in, result, nil
}

// Drain is cordon + stop (docs/design.md §2.9). A cordon refusal aborts before the
// stop; an instance an earlier cordon marked keeps that marker and is
// stopped. It is refused for an instance that hosts this control plane.
func (s *Service) Drain(ctx context.Context, id store.InstanceID, reason, by string) (*store.Instance, string, error) {
	if err := checkReason(reason); err != nil {
		return nil, "", err
	}
	if slices.Contains(s.SelfInstanceIDs, id.String()) {
		return nil, "", fail.Precondition("instance %s hosts this control plane; draining it would stop the control plane itself", id)
	}
	var result string
	fenced, err := s.mutate(ctx, id, "drained", func(q store.Queries, in *store.Instance, now time.Time) error {
		if in.Cordon != nil {
			result = CordonAlreadyCordoned
			return nil
		}
		var err error
		result, err = s.cordon(ctx, q, in, reason, by, now)
		return err
	})
	if err != nil {
		return nil, "", err
	}
	if result == CordonFenced {
		s.memberLeft(fenced)
	}
	in, err := s.Stop(ctx, id)
	if err != nil {
		return nil, result, fmt.Errorf("drain: cordoned (%s), but the stop failed: %w", result, err)
	}
	return in, result, nil
}
