package instances

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/worker"
	"github.com/tetherfleet/tether/internal/macaddr"
	"github.com/tetherfleet/tether/providers"
)

// templateOf reads the template an instance's node boots.
func templateOf(ctx context.Context, q store.Queries, in *store.Instance) (*store.Template, error) {
	node, err := q.GetNodeByID(ctx, in.NodeID)
	if err != nil {
		return nil, err
	}
	return q.GetTemplateByID(ctx, node.TemplateID)
}

// bootFor returns the boot of a new incarnation of in with a fresh
// one-time token, issued in q's transaction (docs/design.md §3.5: every boot needs
// its own token, because a RAM-only node forgets its key and its token is
// spent).
func (s *Service) bootFor(ctx context.Context, q store.Queries, in *store.Instance, now time.Time) (providers.Boot, error) {
	tpl, err := templateOf(ctx, q, in)
	if err != nil {
		return providers.Boot{}, err
	}
	b, err := s.Artifacts.Boot(tpl)
	if err != nil {
		return providers.Boot{}, err
	}
	if s.netboots(in.Provider) {
		// The machine's firmware fetches its per-boot script, which
		// carries a fresh token: one issued here would never be used.
		return b, nil
	}
	tok, err := s.BootToken(ctx, q, in, now)
	if err != nil {
		return providers.Boot{}, err
	}
	b.Enrollment = providers.Enrollment{ControlPlaneURL: s.AgentURL, Token: tok, CAFingerprint: s.Fingerprint(), InstanceID: in.ID.String()}
	return b, nil
}

// BootToken is the token of a new boot of in, issued in q's transaction;
// empty when in's node has a TPM bound (an EK hash): such a boot carries
// no secret, only the instance id, and the TPM proves the machine
// (docs/adr/0023).
func (s *Service) BootToken(ctx context.Context, q store.Queries, in *store.Instance, now time.Time) (string, error) {
	node, err := q.GetNodeByID(ctx, in.NodeID)
	if err != nil {
		return "", fmt.Errorf("read node of instance %s: %w", in.ID, err)
	}
	if len(node.EKHashes) > 0 {
		return "", nil
	}
	return s.issueToken(ctx, q, in.ID, now)
}

// errTerminated ends a task whose instance was terminated under it.
var errTerminated = fmt.Errorf("instance terminated before the task ran: %w", worker.ErrCancelled)

// RunProvision is the worker handler of provision tasks: mark the
// instance provisioning and issue its token (one transaction), create the
// machine, and record it (a second transaction that also ends the task).
// A failure drives mark_errored, with the provider's text on the task and
// the instance and an event. Every step is safe to repeat: a task retried
// after its worker died finds the machine the provider already made.
func (s *Service) RunProvision(ctx context.Context, t *store.Task) error {
	now := s.Clock.Now()
	var in *store.Instance
	var spec providers.Spec
	var p providers.Provider
	var done bool
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		var err error
		if in, err = q.LockInstance(ctx, t.InstanceID); err != nil {
			return err
		}
		if in.Status.Terminal() || in.TerminateRequestedAt != nil {
			return errTerminated
		}
		switch in.Status {
		case lifecycle.Pending:
			if err := s.transition(ctx, q, in, lifecycle.MarkProvisioning, "worker picked up provision task "+t.ID.String(), now); err != nil {
				return err
			}
		case lifecycle.Provisioning:
			// A retry after a worker died: the machine may exist already.
		default:
			return fail.Precondition("instance %s is %s; a provision task only runs for a pending or provisioning instance", in.ID, in.Status)
		}
		if in.CloudInstanceID != "" {
			// The machine was recorded; only the task's end was lost.
			done = true
			_, err := worker.Finish(ctx, q, t, nil, now)
			return err
		}
		if p, err = s.Provider(in.Provider); err != nil {
			return err
		}
		boot, err := s.bootFor(ctx, q, in, now)
		if err != nil {
			return err
		}
		mac, err := s.bootMAC(ctx, q, in, now)
		if err != nil {
			return err
		}
		node, err := q.GetNodeByID(ctx, in.NodeID)
		if err != nil {
			return err
		}
		spec = providers.Spec{InstanceID: in.ID.String(), Region: in.Region, InstanceType: in.InstanceType, Boot: boot, MAC: mac, Node: node.Name}
		return nil
	})
	switch {
	case errors.Is(err, errTerminated):
		_, ferr := worker.FinishTx(ctx, s.Store, s.Clock, t, err)
		return errors.Join(err, ferr)
	case err != nil && ctx.Err() == nil && isRefusal(err):
		// The instance cannot be provisioned (no kernel, provider gone):
		// that is a provision failure like any other.
		return s.failProvision(ctx, t, err)
	case err != nil || done:
		return err
	}

	m, perr := s.provisionWithRetry(ctx, t, p, spec)
	lost := false
	if perr != nil {
		if ctx.Err() != nil {
			if errors.Is(context.Cause(ctx), worker.ErrCancelled) {
				return s.failProvision(context.WithoutCancel(ctx), t, fmt.Errorf("provision cancelled by an operator: %w", worker.ErrCancelled))
			}
			if errors.Is(context.Cause(ctx), worker.ErrLeaseLost) {
				// A terminate cancels the task under us: a machine this
				// call made would have no one else to destroy it.
				s.reapIfTerminated(context.WithoutCancel(ctx), t, p)
			}
			// This worker is stopping or lost its lease: whoever takes
			// the task over finds the machine, if it was made.
			return perr
		}
		// Judge by what exists: a machine in the provider's list means
		// the provision took effect and only its answer was lost.
		found, ok := s.findMachine(ctx, p, in.ID)
		if !ok {
			return s.failProvision(ctx, t, perr)
		}
		m, lost = found, true
		s.Log.Warn("provision reported a failure but the machine exists; recording it", "instance", in.ID, "machine", m.ID, "err", perr)
	}
	return s.recordMachine(ctx, t, p, m, lost, perr)
}

// isRefusal reports whether err is a decision (a status error, a refused
// transition) rather than an accident (the database was unreachable),
// which the task's lease and retry cover instead.
func isRefusal(err error) bool {
	var te *lifecycle.TransitionError
	if errors.As(err, &te) {
		return true
	}
	st, ok := status.FromError(err)
	return ok && st.Code() != codes.Unknown && st.Code() != codes.Unavailable
}

// provisionWithRetry calls Provision, retrying transient failures with a
// doubling backoff; Provision is idempotent by instance id, so a retry of
// a call that did act returns the machine it made.
func (s *Service) provisionWithRetry(ctx context.Context, t *store.Task, p providers.Provider, spec providers.Spec) (providers.Machine, error) {
	attempts := s.ProvisionAttempts
	if attempts <= 0 {
		attempts = DefaultProvisionAttempts
	}
	backoff := s.RetryBackoff
	if backoff <= 0 {
		backoff = DefaultRetryBackoff
	}
	for i := 1; ; i++ {
		cctx, cancel := context.WithTimeout(ctx, s.opTimeout())
		m, err := p.Provision(cctx, spec)
		cancel()
		if err == nil || ctx.Err() != nil || i >= attempts || providers.KindOf(err) != providers.KindTransient {
			return m, err
		}
		s.Log.Warn("provision attempt failed; retrying", "instance", spec.InstanceID, "attempt", i, "of", attempts, "in", backoff, "err", err)
		s.progress(ctx, t, fmt.Sprintf("provision attempt %d of %d failed (%v); retrying in %s", i, attempts, err, backoff))
		timer := s.Clock.NewTimer(backoff)
		select {
		case <-ctx.Done():
			timer.Stop()
			return m, err
		case <-timer.C():
		}
		backoff *= 2
	}
}

// progress notes a retry on the task, best effort.
func (s *Service) progress(ctx context.Context, t *store.Task, msg string) {
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		cur, err := q.LockTask(ctx, t.ID)
		if err != nil || cur.Terminal() || cur.LeaseOwner != t.LeaseOwner {
			return err
		}
		cur.Progress, cur.UpdatedAt = worker.Message(errors.New(msg)), s.Clock.Now()
		return q.UpdateTask(ctx, cur)
	})
	if err != nil {
		s.Log.Warn("record task progress", "task", t.ID, "err", err)
	}
}

// recordMachine stores the machine's id and ends the task in one
// transaction. If the instance was terminated while the machine was being
// made, nothing else will ever destroy it: destroy it here.
func (s *Service) recordMachine(ctx context.Context, t *store.Task, p providers.Provider, m providers.Machine, lost bool, perr error) error {
	now := s.Clock.Now()
	orphan := false
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		in, err := q.LockInstance(ctx, t.InstanceID)
		if err != nil {
			return err
		}
		if in.Status.Terminal() {
			orphan = true
			_, err := worker.Finish(ctx, q, t, errTerminated, now)
			return err
		}
		in.CloudInstanceID, in.ErrorMessage, in.UpdatedAt = m.ID, "", now
		if err := q.UpdateInstance(ctx, in); err != nil {
			return err
		}
		if _, err := (events.E{Kind: events.InstanceMachineCreated, InstanceID: in.ID, CorrelationID: t.ID.Correlation(),
			Message: fmt.Sprintf("provider %s created machine %s", p.Name(), m.ID),
			Payload: events.MachineCreatedPayload{Machine: m.ID, Provider: p.Name(), State: string(m.State)}}).Write(ctx, q, now); err != nil {
			return err
		}
		if lost {
			if _, err := (events.E{Kind: events.InstanceProviderAnswerLost, Severity: events.Medium, InstanceID: in.ID, CorrelationID: t.ID.Correlation(),
				Message: fmt.Sprintf("provision reported %v, but machine %s exists; recorded it", perr, m.ID),
				Payload: events.AnswerLostPayload{Error: perr.Error(), Observed: string(m.State), Op: TaskProvision.String()}}).Write(ctx, q, now); err != nil {
				return err
			}
		}
		_, err = worker.Finish(ctx, q, t, nil, now)
		return err
	})
	if err != nil || !orphan {
		return err
	}
	s.Log.Warn("instance terminated while its machine was being created; destroying the machine", "instance", t.InstanceID, "machine", m.ID)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opTimeout())
	defer cancel()
	terr := p.Terminate(cctx, m.ID)
	sev, msg := events.Medium, fmt.Sprintf("machine %s destroyed: its instance was terminated while it was being created", m.ID)
	if terr != nil {
		sev, msg = events.High, fmt.Sprintf("machine %s of a terminated instance could not be destroyed: %v (provider sync will retry)", m.ID, terr)
	}
	return s.writeEvent(ctx, events.E{Kind: events.InstanceMachineDestroyed, Severity: sev, InstanceID: t.InstanceID, CorrelationID: t.ID.Correlation(),
		Message: msg, Payload: events.MachineDestroyedPayload{Error: errText(terr), Machine: m.ID}})
}

// reapIfTerminated destroys the machine of an instance terminated while
// its provision ran, if the call made one.
func (s *Service) reapIfTerminated(ctx context.Context, t *store.Task, p providers.Provider) {
	in, err := s.Store.GetInstance(ctx, t.InstanceID)
	if err != nil || !in.Status.Terminal() {
		return
	}
	m, ok := s.findMachine(ctx, p, in.ID)
	if !ok {
		return
	}
	if err := s.recordMachine(ctx, t, p, m, false, nil); err != nil {
		s.Log.Warn("destroy the machine of an instance terminated during its provision", "instance", in.ID, "machine", m.ID, "err", err)
	}
}

// failProvision drives mark_errored with the failure on the instance, the
// task and an event, in one transaction.
func (s *Service) failProvision(ctx context.Context, t *store.Task, cause error) error {
	now := s.Clock.Now()
	msg := "provision failed: " + worker.Message(cause)
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		in, err := q.LockInstance(ctx, t.InstanceID)
		if err != nil {
			return err
		}
		switch in.Status {
		case lifecycle.Pending, lifecycle.Provisioning:
			in.ErrorMessage = msg
			if err := s.transition(ctx, q, in, lifecycle.MarkErrored, msg, now); err != nil {
				return err
			}
		}
		if _, err := (events.E{Kind: events.InstanceProviderFailed, Severity: events.High, InstanceID: in.ID, CorrelationID: t.ID.Correlation(),
			Message: msg, Payload: events.ProvisionFailedPayload{Error: worker.Message(cause), Kind: string(errKind(cause)),
				Op: TaskProvision.String(), Provider: in.Provider}}).Write(ctx, q, now); err != nil {
			return err
		}
		_, err = worker.Finish(ctx, q, t, cause, now)
		return err
	})
	if err != nil {
		return errors.Join(cause, err)
	}
	return cause
}

// SweepProvisions errors instances left pending or provisioning with no
// machine and no live provision task (its attempts ran out, or an operator
// cancelled it), so that none dangles (docs/design.md §2.3). It returns how many it
// errored.
func (s *Service) SweepProvisions(ctx context.Context) (int, error) {
	ins, err := s.Store.ListInstances(ctx, store.InstanceFilter{Statuses: []lifecycle.State{lifecycle.Pending, lifecycle.Provisioning}},
		store.Page{Limit: store.MaxPageSize})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, in := range ins {
		if in.Provider == ProviderExternal || in.CloudInstanceID != "" || in.TerminateRequestedAt != nil {
			continue
		}
		errored, err := s.sweepOne(ctx, in.ID)
		if err != nil {
			return n, err
		}
		if errored {
			n++
		}
	}
	return n, nil
}

func (s *Service) sweepOne(ctx context.Context, id store.InstanceID) (bool, error) {
	now := s.Clock.Now()
	errored := false
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		in, err := q.LockInstance(ctx, id)
		if err != nil {
			return err
		}
		st := in.Status
		if (st != lifecycle.Pending && st != lifecycle.Provisioning) || in.CloudInstanceID != "" {
			return nil
		}
		ts, err := q.ListTasks(ctx, store.TaskFilter{InstanceID: id, Target: store.TaskTargetWorker}, store.Page{Limit: store.MaxPageSize})
		if err != nil {
			return err
		}
		var last *store.Task
		for _, t := range ts {
			if t.Kind != TaskProvision {
				continue
			}
			if !t.Terminal() {
				return nil // still being worked on
			}
			last = t
		}
		reason := "provision failed: no provision task exists for this instance"
		if last != nil {
			if last.Status == store.TaskSucceeded {
				return nil
			}
			reason = fmt.Sprintf("provision failed: task %s %s: %s", last.ID, last.Status, last.ErrorMessage)
		}
		errored = true
		in.ErrorMessage = reason
		if err := s.transition(ctx, q, in, lifecycle.MarkErrored, reason, now); err != nil {
			return err
		}
		_, err = events.E{Kind: events.InstanceProviderFailed, Severity: events.High, InstanceID: id,
			Message: reason, Payload: events.ProvisionAbandonedPayload{Op: TaskProvision.String(), Provider: in.Provider}}.Write(ctx, q, now)
		return err
	})
	return errored, err
}

func (s *Service) writeEvent(ctx context.Context, e events.E) error {
	now := s.Clock.Now()
	ctx = context.WithoutCancel(ctx)
	return s.Store.Tx(ctx, func(q store.Queries) error {
		_, err := e.Write(ctx, q, now)
		return err
	})
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// netboots reports whether the named provider's machines boot from their
// firmware over the network (providers.Netbooter).
func (s *Service) netboots(provider string) bool {
	p, err := s.Provider(provider)
	if err != nil {
		return false
	}
	nb, ok := p.(providers.Netbooter)
	return ok && nb.Netboots()
}

// maxMACTries bounds the draws of a fresh address that collides with
// another node's (2^24 choices: a retry is already rare).
const maxMACTries = 5

// bootMAC is the hardware address of in's machine: its node's first. A
// netbooting machine of a node that has none gets a generated one, which
// is recorded on the node so the boot route finds it.
func (s *Service) bootMAC(ctx context.Context, q store.Queries, in *store.Instance, now time.Time) (string, error) {
	node, err := q.GetNodeByID(ctx, in.NodeID)
	if err != nil {
		return "", err
	}
	if len(node.MACs) > 0 || !s.netboots(in.Provider) {
		if len(node.MACs) > 0 {
			return node.MACs[0], nil
		}
		return "", nil
	}
	for range maxMACTries {
		mac, err := generateMAC()
		if err != nil {
			return "", err
		}
		if _, err := q.GetNodeByMAC(ctx, mac); !errors.Is(err, store.ErrNotFound) {
			if err != nil {
				return "", err
			}
			continue // taken
		}
		node.MACs, node.UpdatedAt = []string{mac}, now
		if err := q.UpdateNode(ctx, node); err != nil {
			return "", err
		}
		_, err = events.E{Kind: events.NodeMACGenerated, InstanceID: in.ID,
			Message: fmt.Sprintf("node %s had no hardware address; generated %s for its netbooting machine", node.Name, mac),
			Payload: events.MACGeneratedPayload{MAC: mac, Node: node.Name}}.Write(ctx, q, now)
		return mac, err
	}
	return "", fail.Precondition("node %s has no hardware address, and %d generated ones were all taken", node.Name, maxMACTries)
}

// generateMAC draws an address in QEMU's own range, 52:54:00:xx:xx:xx.
func generateMAC() (string, error) {
	b := []byte{0x52, 0x54, 0x00, 0, 0, 0}
	if _, err := rand.Read(b[3:]); err != nil {
		return "", fmt.Errorf("generate a hardware address: %w", err)
	}
	return macaddr.Format(b), nil
}
