package instances

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/pool/claims"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/providers"
)

// Terminate destroys an instance's machine and ends its identity. It is
// two-phase (docs/design.md §2.4): the intent (terminate_requested_at) commits first,
// then the provider destroys the machine, then a second transaction marks
// the instance terminated, revokes its certificates and expires its unused
// tokens. If the control plane dies between the phases, ResumeTerminates
// finds the intent and finishes; a row therefore never reads terminated
// while its machine may still run. A provider failure leaves the instance
// as it was (the intent withdrawn), returns the error and writes
// instance.terminate_failed. Terminating a terminated instance succeeds.
func (s *Service) Terminate(ctx context.Context, id store.InstanceID) (*store.Instance, error) {
	if id == "" {
		return nil, fail.Invalid("id", "required")
	}
	now := s.Clock.Now()
	var in *store.Instance
	done := false
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		var err error
		if in, err = q.LockInstance(ctx, id); err != nil {
			return err
		}
		if in.Status.Terminal() {
			done = true
			return nil
		}
		if in.Hold {
			return fail.Precondition("instance %s is on an ops hold (%s): terminate is refused until `tetherctl instance unhold %s`",
				in.ID, in.HoldReason, in.ID)
		}
		if _, err := lifecycle.Next(in.Status, lifecycle.Terminate); err != nil {
			return err
		}
		if in.TerminateRequestedAt != nil {
			return nil // another terminate is under way; driving it again is harmless
		}
		in.TerminateRequestedAt, in.UpdatedAt = &now, now
		if err := q.UpdateInstance(ctx, in); err != nil {
			return err
		}
		_, err = events.E{Kind: events.InstanceTerminateRequested, InstanceID: in.ID,
			Message: fmt.Sprintf("terminate requested (instance %s, machine %q)", in.Status, in.CloudInstanceID),
			Payload: events.TerminateRequestedPayload{Machine: in.CloudInstanceID, Status: in.Status}}.Write(ctx, q, now)
		return err
	})
	if err != nil || done {
		return in, err
	}
	return s.finishTerminate(ctx, in)
}

// finishTerminate is phase two: destroy the machine, then mark the
// instance terminated. in carries a recorded intent.
func (s *Service) finishTerminate(ctx context.Context, in *store.Instance) (*store.Instance, error) {
	p, err := s.Provider(in.Provider)
	if err != nil {
		return nil, s.terminateFailed(ctx, in.ID, "", err, observed{state: providers.StateUnknown, err: err})
	}
	machine, terr := s.machineID(ctx, p, in)
	if terr != nil {
		if ctx.Err() != nil {
			return nil, errors.Join(terr, ctx.Err())
		}
		terr = fmt.Errorf("cannot tell whether instance %s has a machine: %w", in.ID, terr)
		return nil, s.terminateFailed(ctx, in.ID, "", terr, observed{state: providers.StateUnknown, err: terr})
	}
	if machine != "" {
		cctx, cancel := context.WithTimeout(ctx, s.opTimeout())
		terr = p.Terminate(cctx, machine)
		cancel()
	}
	lost := false
	if terr != nil {
		if ctx.Err() != nil {
			// No answer and no time to get one: the intent stays for the
			// reconciler, exactly as if we had crashed here.
			return nil, errors.Join(terr, ctx.Err())
		}
		obs := s.observe(ctx, p, machine)
		if obs.err != nil || obs.state != providers.StateGone {
			return nil, s.terminateFailed(ctx, in.ID, machine, terr, obs)
		}
		lost = true // the machine is gone: the destroy took effect
	}
	return s.markTerminated(ctx, in.ID, machine, lost, terr)
}

// terminateFailed records a failed destroy: the instance keeps its state,
// the intent is withdrawn (the caller has the error and decides), and
// instance.terminate_failed says why.
func (s *Service) terminateFailed(ctx context.Context, id store.InstanceID, machine string, terr error, obs observed) error {
	now := s.Clock.Now()
	msg := fmt.Sprintf("terminate failed: %v; machine %q observed %s", terr, machine, obs)
	ctx = context.WithoutCancel(ctx) // the failure is recorded even if the caller left
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		in, err := q.LockInstance(ctx, id)
		if err != nil {
			return err
		}
		if in.Status.Terminal() {
			return nil
		}
		in.TerminateRequestedAt, in.ErrorMessage, in.UpdatedAt = nil, msg, now
		if err := q.UpdateInstance(ctx, in); err != nil {
			return err
		}
		_, err = events.E{Kind: events.InstanceTerminateFailed, Severity: events.High, InstanceID: id, Message: msg,
			Payload: events.TerminateFailedPayload{Error: errText(terr), Kind: string(errKind(terr)), Machine: machine,
				Observed: obs.String(), Provider: in.Provider}}.Write(ctx, q, now)
		return err
	})
	return errors.Join(terr, err)
}

// markTerminated is the second transaction: terminated, certificates
// revoked (and open streams told, so they are cut), unused tokens expired,
// open tasks cancelled, an open pool claim closed.
func (s *Service) markTerminated(ctx context.Context, id store.InstanceID, machine string, lost bool, terr error) (*store.Instance, error) {
	now := s.Clock.Now()
	var out *store.Instance
	ended := false
	defer func() {
		if ended {
			s.memberLeft(out)
		}
	}()
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		in, err := q.LockInstance(ctx, id)
		if err != nil {
			return err
		}
		out, ended = in, false
		if in.Status.Terminal() {
			return nil
		}
		if err := s.transition(ctx, q, in, lifecycle.Terminate, "machine destroyed", now); err != nil {
			return err
		}
		serials, err := q.RevokeInstanceCertificates(ctx, id, "instance terminated", now)
		if err != nil {
			return err
		}
		for _, serial := range serials {
			if err := q.Notify(ctx, store.ChannelRevocations, serial.String()); err != nil {
				return err
			}
		}
		expired, err := q.ExpireInstanceTokens(ctx, id, now)
		if err != nil {
			return err
		}
		cancelled, err := cancelTasks(ctx, q, id, now)
		if err != nil {
			return err
		}
		if err := closeClaim(ctx, q, in, now); err != nil {
			return err
		}
		if lost {
			if _, err := (events.E{Kind: events.InstanceProviderAnswerLost, Severity: events.Medium, InstanceID: id,
				Message: fmt.Sprintf("terminate reported %v, but machine %s is gone: counted as done", terr, machine),
				Payload: events.AnswerLostPayload{Error: errText(terr), Observed: string(providers.StateGone), Op: "terminate"}}).Write(ctx, q, now); err != nil {
				return err
			}
		}
		_, err = events.E{Kind: events.InstanceTerminated, Severity: events.Medium, InstanceID: id,
			Message: fmt.Sprintf("instance terminated: machine %q destroyed, %d certificate(s) revoked, %d token(s) expired, %d task(s) cancelled",
				machine, len(serials), expired, cancelled),
			Payload: events.TerminatedPayload{Machine: machine, Revoked: serials, TasksCancelled: cancelled, TokensExpired: expired}}.Write(ctx, q, now)
		ended = err == nil
		return err
	})
	ended = ended && err == nil
	return out, err
}

// cancelTasks ends every open task of an instance: a terminated instance
// runs nothing, and a worker holding one of them finds it cancelled.
func cancelTasks(ctx context.Context, q store.Queries, id store.InstanceID, now time.Time) (int, error) {
	ts, err := q.ListTasks(ctx, store.TaskFilter{InstanceID: id, Statuses: []store.TaskStatus{store.TaskPending, store.TaskLeased, store.TaskRunning}},
		store.Page{Limit: store.MaxPageSize})
	if err != nil {
		return 0, err
	}
	for _, t := range ts {
		t.Status, t.ErrorMessage, t.LeaseExpiresAt, t.UpdatedAt = store.TaskCancelled, "instance terminated", nil, now
		if err := q.UpdateTask(ctx, t); err != nil {
			return 0, err
		}
	}
	if len(ts) > 0 {
		return len(ts), q.Notify(ctx, store.ChannelTasks, id.String())
	}
	return 0, nil
}

// closeClaim closes the open claim of a member being marked terminated
// (docs/design.md §4.5), in that transaction, so no phantom claimed member stays
// counted. A member terminated while claimed closes with disposition
// terminated; one whose release had begun (draining, claim id still set)
// closes as the release meant it to: recycled.
func closeClaim(ctx context.Context, q store.Queries, in *store.Instance, now time.Time) error {
	if !claims.Open(in) {
		return nil
	}
	disposition := claims.Recycled
	if in.PoolState == lifecycle.PoolClaimed {
		disposition = claims.Terminated
	}
	if _, err := claims.Close(ctx, q, in, disposition, "", now); err != nil {
		return err
	}
	// A terminated member has left its pool: draining is the state that
	// says so without counting it anywhere.
	in.PoolState, in.UpdatedAt = lifecycle.PoolDraining, now
	return q.UpdateInstance(ctx, in)
}

// nonTerminal are the states a terminate intent can wait in.
var nonTerminal = func() []lifecycle.State {
	var out []lifecycle.State
	for _, st := range lifecycle.States() {
		if !st.Terminal() {
			out = append(out, st)
		}
	}
	return out
}()

// ResumeTerminates finishes terminates whose intent was recorded at least
// olderThan ago and never completed: the control plane died between the
// phases. At start-up olderThan is zero; the periodic pass leaves recent
// intents to the calls still driving them. It returns how many it finished.
func (s *Service) ResumeTerminates(ctx context.Context, olderThan time.Duration) (int, error) {
	ins, err := s.Store.ListInstances(ctx, store.InstanceFilter{TerminateRequested: true, Statuses: nonTerminal}, store.Page{Limit: store.MaxPageSize})
	if err != nil {
		return 0, err
	}
	now := s.Clock.Now()
	n := 0
	var errs []error
	for _, in := range ins {
		if in.TerminateRequestedAt == nil || now.Sub(*in.TerminateRequestedAt) < olderThan {
			continue
		}
		s.Log.Info("resuming an interrupted terminate", "instance", in.ID, "requested_at", in.TerminateRequestedAt)
		if _, err := s.finishTerminate(ctx, in); err != nil {
			errs = append(errs, fmt.Errorf("instance %s: %w", in.ID, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
