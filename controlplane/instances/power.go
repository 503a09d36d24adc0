package instances

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/worker"
	"github.com/tetherfleet/tether/providers"
)

// op is one power operation. Each runs as a worker task that the API call
// holds itself: the task is the trail (`tetherctl task list`), the lock
// that keeps two provider operations on one machine from racing, and the
// resume point should this replica die mid-call (its lease lapses and a
// worker repeats the operation).
//
// The row moves only after the provider answered, by the observed state
// (docs/design.md §2.6 and §0.1): a stop that failed leaves a running instance
// reading running, never stopping, because nothing in the lifecycle leads
// back from stopping.
type op struct {
	kind  store.TaskKind  // task kind
	event lifecycle.Event // the operator's event
	// then are the events that follow event once the provider confirms.
	then []lifecycle.Event
	boot bool                   // a new boot, which gets a fresh token
	want providers.MachineState // the observed state that means success
}

var (
	opStart  = op{kind: TaskStart, event: lifecycle.Start, boot: true, want: providers.StateRunning}
	opStop   = op{kind: TaskStop, event: lifecycle.Stop, then: []lifecycle.Event{lifecycle.MarkStopped}, want: providers.StateStopped}
	opReboot = op{kind: TaskReboot, event: lifecycle.Reboot, boot: true, want: providers.StateRunning}
)

func opFor(kind store.TaskKind) (op, bool) {
	switch kind {
	case TaskStart:
		return opStart, true
	case TaskStop:
		return opStop, true
	case TaskReboot:
		return opReboot, true
	}
	return op{}, false
}

// Start boots a stopped instance with a fresh token. Starting a starting
// or running instance succeeds without a provider call.
func (s *Service) Start(ctx context.Context, id store.InstanceID) (*store.Instance, error) {
	return s.power(ctx, id, opStart)
}

// Stop stops a running instance. It is allowed under an ops hold (a drain
// must work on a held instance). Stopping a stopped instance succeeds
// without a provider call.
func (s *Service) Stop(ctx context.Context, id store.InstanceID) (*store.Instance, error) {
	return s.power(ctx, id, opStop)
}

// Reboot restarts a running instance as a new boot with a fresh token.
func (s *Service) Reboot(ctx context.Context, id store.InstanceID) (*store.Instance, error) {
	return s.power(ctx, id, opReboot)
}

// check decides whether o may run on in: a refusal, a no-op (the
// instance already is where o leads), or go. ownTask is the task running
// o, which does not count as a competing operation.
func (s *Service) check(ctx context.Context, q store.Queries, in *store.Instance, o op, ownTask store.TaskID) (noop bool, err error) {
	st := in.Status
	switch {
	case st.Terminal():
		return false, fail.Precondition("instance %s is terminated; it cannot %s", in.ID, o.kind)
	case in.TerminateRequestedAt != nil:
		return false, fail.Precondition("instance %s is being terminated (requested %s); it cannot %s",
			in.ID, in.TerminateRequestedAt.UTC().Format(time.RFC3339), o.kind)
	case in.Hold && o.event != lifecycle.Stop:
		return false, fail.Precondition("instance %s is on an ops hold (%s): %s is refused until `tetherctl instance unhold %s`",
			in.ID, in.HoldReason, o.kind, in.ID)
	case lifecycle.Satisfied(st, o.event):
		return true, nil
	}
	if _, err := lifecycle.Next(st, o.event); err != nil {
		return false, err
	}
	if _, err := s.Provider(in.Provider); err != nil {
		return false, err
	}
	if in.CloudInstanceID == "" {
		return false, fail.Precondition("instance %s has no machine recorded; there is nothing to %s", in.ID, o.kind)
	}
	ts, err := q.ListTasks(ctx, store.TaskFilter{InstanceID: in.ID, Target: store.TaskTargetWorker,
		Statuses: []store.TaskStatus{store.TaskPending, store.TaskLeased, store.TaskRunning}}, store.Page{Limit: store.MaxPageSize})
	if err != nil {
		return false, err
	}
	for _, t := range ts {
		if t.ID != ownTask {
			return false, fail.Precondition("instance %s has a %s operation in progress (task %s, %s); wait for it to end or cancel it",
				in.ID, t.Kind, t.ID, t.Status)
		}
	}
	return false, nil
}

// power runs o from an API call: check and record the task (and, for a
// boot, the token) in one transaction, call the provider while holding the
// task's lease, then settle by the observed state in a second one.
func (s *Service) power(ctx context.Context, id store.InstanceID, o op) (*store.Instance, error) {
	if id == "" {
		return nil, fail.Invalid("id", "required")
	}
	now := s.Clock.Now()
	var in *store.Instance
	var t *store.Task
	var boot providers.Boot
	noop := false
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		var err error
		if in, err = q.LockInstance(ctx, id); err != nil {
			return err
		}
		if noop, err = s.check(ctx, q, in, o, ""); err != nil || noop {
			return err
		}
		if o.boot {
			if boot, err = s.bootFor(ctx, q, in, now); err != nil {
				return err
			}
		}
		t = worker.NewLeased(in.ID, o.kind, s.owner(), now, s.Lease)
		return q.CreateTask(ctx, t)
	})
	if err != nil || noop {
		return in, err
	}
	p, err := s.Provider(in.Provider)
	if err != nil {
		return nil, err
	}
	var m providers.Machine
	herr := worker.Hold(ctx, s.Store, s.Clock, t, s.Lease, func(hctx context.Context) error {
		var err error
		m, err = s.call(hctx, p, o, in.CloudInstanceID, boot)
		return err
	})
	if ctx.Err() != nil {
		// The caller went away or we are shutting down: the task stays
		// leased and a worker repeats the operation once it lapses.
		return nil, errors.Join(herr, ctx.Err())
	}
	return s.settle(ctx, t, p, o, in.CloudInstanceID, m, herr)
}

// RunOp is the worker handler of start, stop and reboot tasks: it repeats
// an operation whose first executor died before settling it.
func (s *Service) RunOp(ctx context.Context, t *store.Task) error {
	o, ok := opFor(t.Kind)
	if !ok {
		return fmt.Errorf("instances: %q is not a power operation", t.Kind)
	}
	now := s.Clock.Now()
	var in *store.Instance
	var boot providers.Boot
	noop := false
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		var err error
		if in, err = q.LockInstance(ctx, t.InstanceID); err != nil {
			return err
		}
		if noop, err = s.check(ctx, q, in, o, t.ID); err != nil {
			return err
		}
		if noop {
			_, err = worker.Finish(ctx, q, t, nil, now)
			return err
		}
		if o.boot {
			boot, err = s.bootFor(ctx, q, in, now)
		}
		return err
	})
	if err != nil || noop {
		return err
	}
	p, err := s.Provider(in.Provider)
	if err != nil {
		return err
	}
	m, cerr := s.call(ctx, p, o, in.CloudInstanceID, boot)
	if ctx.Err() != nil && !errors.Is(context.Cause(ctx), worker.ErrCancelled) {
		return errors.Join(cerr, ctx.Err())
	}
	if errors.Is(context.Cause(ctx), worker.ErrCancelled) {
		cerr = errors.Join(cerr, worker.ErrCancelled)
	}
	_, err = s.settle(context.WithoutCancel(ctx), t, p, o, in.CloudInstanceID, m, cerr)
	return err
}

func (s *Service) call(ctx context.Context, p providers.Provider, o op, machine string, boot providers.Boot) (providers.Machine, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout())
	defer cancel()
	switch o.event {
	case lifecycle.Start:
		return p.Start(ctx, machine, boot)
	case lifecycle.Reboot:
		return p.Reboot(ctx, machine, boot)
	default:
		return p.Stop(ctx, machine)
	}
}

// outcome is how a provider call ended, judged by what was observed.
type outcome int

const (
	succeeded outcome = iota
	// answerLost: the call failed, but the observed state is what it
	// would have produced.
	answerLost
	failed
	gone
)

// judge decides an operation's outcome. A failed call is judged by the
// machine's observed state: for stop and start the state tells whether
// the call acted. A reboot cannot be told from a machine that merely kept
// running, so a failed reboot stays failed whatever is observed.
func (s *Service) judge(ctx context.Context, p providers.Provider, o op, machine string, m providers.Machine, err error) (outcome, observed) {
	if err == nil {
		obs := observed{state: m.State}
		if m.State == o.want {
			return succeeded, obs
		}
		if m.State == providers.StateGone {
			return gone, obs
		}
		return failed, obs
	}
	obs := s.observe(ctx, p, machine)
	switch {
	case providers.IsNotFound(err) || (obs.err == nil && obs.state == providers.StateGone):
		return gone, obs
	case obs.err == nil && obs.state == o.want && o.event != lifecycle.Reboot:
		return answerLost, obs
	}
	return failed, obs
}

// settle records an operation's outcome and ends its task in one
// transaction, and returns what the caller is told.
func (s *Service) settle(ctx context.Context, t *store.Task, p providers.Provider, o op, machine string, m providers.Machine, herr error) (*store.Instance, error) {
	if errors.Is(herr, worker.ErrLeaseLost) {
		// Terminate ends every open task of its instance, this one
		// included: that is a race lost to terminate, not a lease handed
		// to another worker, and nobody will finish this operation.
		if in, err := s.Store.GetInstance(ctx, t.InstanceID); err == nil && (in.Status.Terminal() || in.TerminateRequestedAt != nil) {
			return in, fail.Precondition("instance %s was terminated while its %s ran", in.ID, o.kind)
		}
		return nil, fail.Unavailable("the %s of instance %s lost its task lease (task %s); another worker finishes it: read the instance again shortly",
			o.kind, t.InstanceID, t.ID)
	}
	res, obs := s.judge(ctx, p, o, machine, m, herr)
	if res == failed && herr == nil {
		herr = providers.Errorf(providers.KindPermanent, p.Name(), o.kind.String(), "provider reported success but machine %s is %s", machine, obs)
	}
	now := s.Clock.Now()
	var out *store.Instance
	var answer error
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		in, err := q.LockInstance(ctx, t.InstanceID)
		if err != nil {
			return err
		}
		out = in
		if in.Status.Terminal() || in.TerminateRequestedAt != nil {
			answer = fail.Precondition("instance %s was terminated while its %s ran", in.ID, o.kind)
			_, err := worker.Finish(ctx, q, t, errTerminated, now)
			return err
		}
		switch res {
		case succeeded, answerLost:
			if err := s.advance(ctx, q, in, o, now); err != nil {
				var te *lifecycle.TransitionError
				if !errors.As(err, &te) {
					return err
				}
				// The row moved under us (liveness or provider sync
				// decided meanwhile); their word stands.
				answer = err
				_, err = worker.Finish(ctx, q, t, err, now)
				return err
			}
			if res == answerLost {
				if _, err := (events.E{Kind: events.InstanceProviderAnswerLost, Severity: events.Medium, InstanceID: in.ID, CorrelationID: t.ID.Correlation(),
					Message: fmt.Sprintf("%s reported %v, but machine %s is observed %s: counted as done", o.kind, herr, machine, obs),
					Payload: events.AnswerLostPayload{Error: herr.Error(), Observed: obs.String(), Op: o.kind.String()}}).Write(ctx, q, now); err != nil {
					return err
				}
			}
			_, err = worker.Finish(ctx, q, t, nil, now)
			return err
		case gone:
			msg := fmt.Sprintf("machine %s is gone (provider %s): %s found nothing to act on", machine, p.Name(), o.kind)
			answer = fail.Precondition("%s; instance %s is now in error: terminate it and provision again", msg, in.ID)
			in.ErrorMessage = msg
			if err := s.transition(ctx, q, in, lifecycle.MarkErrored, msg, now); err != nil {
				return err
			}
			if err := s.failEvent(ctx, q, in, t, o.kind.String(), herr, obs, msg, now); err != nil {
				return err
			}
			_, err = worker.Finish(ctx, q, t, answer, now)
			return err
		default:
			msg := fmt.Sprintf("%s failed: %s; machine observed %s", o.kind, worker.Message(herr), obs)
			answer = herr
			if errKind(herr) != providers.KindUnsupported {
				// The row keeps the state it had, which is the state
				// observed; the reason goes beside it.
				in.ErrorMessage, in.UpdatedAt = msg, now
				if err := q.UpdateInstance(ctx, in); err != nil {
					return err
				}
			}
			if err := s.failEvent(ctx, q, in, t, o.kind.String(), herr, obs, msg, now); err != nil {
				return err
			}
			_, err = worker.Finish(ctx, q, t, herr, now)
			return err
		}
	})
	if err != nil {
		return nil, errors.Join(answer, err)
	}
	return out, answer
}

// advance applies o's event and what follows it, unless the instance is
// already there; all transitions are checked before any is written.
func (s *Service) advance(ctx context.Context, q store.Queries, in *store.Instance, o op, now time.Time) error {
	evs := append([]lifecycle.Event{o.event}, o.then...)
	st := in.Status
	var todo []lifecycle.Event
	for _, ev := range evs {
		next, err := lifecycle.Next(st, ev)
		if err != nil {
			if lifecycle.Satisfied(st, ev) {
				continue
			}
			return err
		}
		todo, st = append(todo, ev), next
	}
	in.ErrorMessage = ""
	reason := "provider confirmed " + o.kind.String()
	for _, ev := range todo {
		if err := s.transition(ctx, q, in, ev, reason, now); err != nil {
			return err
		}
	}
	if len(todo) == 0 {
		in.UpdatedAt = now
		return q.UpdateInstance(ctx, in)
	}
	return nil
}

func (s *Service) failEvent(ctx context.Context, q store.Queries, in *store.Instance, t *store.Task, opName string, herr error, obs observed, msg string, now time.Time) error {
	_, err := events.E{Kind: events.InstanceProviderFailed, Severity: events.High, InstanceID: in.ID, CorrelationID: t.ID.Correlation(),
		Message: msg, Payload: events.ProviderFailedPayload{Error: errText(herr), Kind: string(errKind(herr)), Observed: obs.String(),
			Op: opName, Provider: in.Provider}}.Write(ctx, q, now)
	return err
}
