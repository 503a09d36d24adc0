// Package tasks is the task queue (docs/design.md §6): agent tasks pushed to a
// connected agent the moment they are created, and worker tasks run inside
// the control plane, both leased so that a dead executor does not lose work.
package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/clock"
)

// Defaults and bounds.
const (
	DefaultMaxAttempts    = 3
	MaxMaxAttempts        = 20
	DefaultLease          = 60 * time.Second
	DefaultMaxOutputBytes = 64 << 10
	DefaultExecTimeout    = 300
	MaxExecTimeout        = 24 * 3600
	maxArgv               = 256
	maxArgBytes           = 64 << 10
)

// Agent task kinds.
const (
	KindExec             = store.TaskKindExec
	KindReboot           = store.TaskKindReboot
	KindPoweroff         = store.TaskKindPoweroff
	KindModuleSync       = store.TaskKindModuleSync
	KindRenewCertificate = store.TaskKindRenewCertificate
)

// AgentKinds are the kinds an agent executes.
var AgentKinds = []store.TaskKind{KindExec, KindReboot, KindPoweroff, KindModuleSync, KindRenewCertificate}

// Service manages tasks.
type Service struct {
	Store          store.Store
	Clock          clock.Clock
	Log            *slog.Logger
	Lease          time.Duration // zero: DefaultLease
	MaxOutputBytes int           // zero: DefaultMaxOutputBytes
}

// Exec is an exec task's payload.
type Exec struct {
	Argv           []string `json:"argv"`
	TimeoutSeconds int32    `json:"timeout_seconds,omitempty"`
}

func (s *Service) lease() time.Duration {
	if s.Lease > 0 {
		return s.Lease
	}
	return DefaultLease
}

// MaxOutput is the output cap agents are told and the server enforces.
func (s *Service) MaxOutput() int {
	if s.MaxOutputBytes > 0 {
		return s.MaxOutputBytes
	}
	return DefaultMaxOutputBytes
}

// LeaseDuration is how long an agent holds a task between progress reports.
func (s *Service) LeaseDuration() time.Duration { return s.lease() }

// CreateAgentTask queues a task for an instance's agent and wakes the
// replica holding its stream.
func (s *Service) CreateAgentTask(ctx context.Context, instanceID store.InstanceID, kind store.TaskKind, exec *Exec, maxAttempts int) (*store.Task, error) {
	if instanceID == "" {
		return nil, fail.Invalid("instance_id", "required")
	}
	if !slices.Contains(AgentKinds, kind) {
		return nil, fail.Invalid("kind", "%q is not an agent task kind (one of %v)", kind, AgentKinds)
	}
	payload := []byte("{}")
	switch {
	case kind == KindExec:
		if err := validateExec(exec); err != nil {
			return nil, err
		}
		b, err := json.Marshal(exec)
		if err != nil {
			return nil, fmt.Errorf("encode exec payload: %w", err)
		}
		payload = b
	case exec != nil:
		return nil, fail.Invalid("exec", "only exec tasks take an exec payload")
	}
	if maxAttempts == 0 {
		maxAttempts = DefaultMaxAttempts
	}
	if maxAttempts < 1 || maxAttempts > MaxMaxAttempts {
		return nil, fail.Invalid("max_attempts", "%d is out of range (1..%d)", maxAttempts, MaxMaxAttempts)
	}
	now := s.Clock.Now()
	t := &store.Task{Target: store.TaskTargetAgent, InstanceID: instanceID, Kind: kind, Payload: payload,
		Status: store.TaskPending, MaxAttempts: maxAttempts, CreatedAt: now, UpdatedAt: now}
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		in, err := q.GetInstance(ctx, instanceID)
		if err != nil {
			return err
		}
		if in.Status == lifecycle.Terminated {
			return fail.Precondition("instance %s is terminated; it runs no tasks", instanceID)
		}
		if in.PoolState == lifecycle.PoolWarming {
			return fail.Precondition("instance %s is a warming pool member; it leases no tasks until it is ready", instanceID)
		}
		if err := q.CreateTask(ctx, t); err != nil {
			return err
		}
		if _, err := (events.E{Kind: events.TaskCreated, InstanceID: instanceID, CorrelationID: t.ID.Correlation(),
			Message: fmt.Sprintf("%s task %s created", kind, t.ID)}).Write(ctx, q, now); err != nil {
			return err
		}
		return q.Notify(ctx, store.ChannelTasks, instanceID.String())
	})
	if err != nil {
		return nil, err
	}
	return t, nil
}

func validateExec(e *Exec) error {
	if e == nil || len(e.Argv) == 0 {
		return fail.Invalid("exec.argv", "required: the command and its arguments")
	}
	if len(e.Argv) > maxArgv {
		return fail.Invalid("exec.argv", "%d arguments is more than %d", len(e.Argv), maxArgv)
	}
	total := 0
	for i, a := range e.Argv {
		total += len(a)
		if i == 0 && a == "" {
			return fail.Invalid("exec.argv[0]", "the command must not be blank")
		}
	}
	if total > maxArgBytes {
		return fail.Invalid("exec.argv", "%d bytes of arguments is more than %d", total, maxArgBytes)
	}
	if e.TimeoutSeconds < 0 || e.TimeoutSeconds > MaxExecTimeout {
		return fail.Invalid("exec.timeout_seconds", "%d is out of range (0..%d)", e.TimeoutSeconds, MaxExecTimeout)
	}
	return nil
}

// Cancel cancels a task: a pending one at once, a leased or running one
// by telling its executor to stop.
func (s *Service) Cancel(ctx context.Context, id store.TaskID) (*store.Task, error) {
	var t *store.Task
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		var err error
		if t, err = q.LockTask(ctx, id); err != nil {
			return err
		}
		now := s.Clock.Now()
		switch t.Status {
		case store.TaskCancelled:
			return nil // already where the caller wants it
		case store.TaskSucceeded, store.TaskFailed:
			return fail.Precondition("task %s already %s; only pending, leased or running tasks can be cancelled", id, t.Status)
		case store.TaskPending:
			t.Status, t.ErrorMessage = store.TaskCancelled, "cancelled before it started"
		default:
			if t.CancelRequested {
				return nil
			}
			t.CancelRequested = true
		}
		t.UpdatedAt = now
		if err := q.UpdateTask(ctx, t); err != nil {
			return err
		}
		return q.Notify(ctx, store.ChannelTasks, t.InstanceID.String())
	})
	return t, err
}

// Owner names the lease holder for an agent task.
func Owner(instanceID store.InstanceID) string { return "agent:" + instanceID.String() }

// LeaseNext leases the oldest pending agent task of an instance, or
// returns nil when there is none.
func (s *Service) LeaseNext(ctx context.Context, instanceID store.InstanceID) (*store.Task, error) {
	now := s.Clock.Now()
	var t *store.Task
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		var err error
		t, err = q.ClaimTask(ctx, store.TaskClaim{Target: store.TaskTargetAgent, InstanceID: instanceID,
			Owner: Owner(instanceID), Now: now, LeaseUntil: now.Add(s.lease())})
		if err != nil {
			return err
		}
		// Creation already refuses warming members; this keeps a task that
		// reached one by any other path from being leased (the lease rolls
		// back). It costs a read only when there is a task to hand out.
		in, err := q.GetInstance(ctx, instanceID)
		if err != nil {
			return err
		}
		if in.PoolState == lifecycle.PoolWarming {
			return errWarming
		}
		return nil
	})
	if errors.Is(err, store.ErrNotFound) || errors.Is(err, errWarming) {
		return nil, nil
	}
	return t, err
}

var errWarming = errors.New("warming pool members lease no tasks")

// Open says whether an instance has an agent task waiting to be leased,
// and which leased or running ones were asked to cancel (store.AgentWork,
// one statement of three index seeks). A stream checks this on every wake and poll; only when a task
// is pending does it pay for a claim transaction.
func (s *Service) Open(ctx context.Context, instanceID store.InstanceID) (pending bool, cancels []*store.Task, err error) {
	return s.Store.AgentWork(ctx, instanceID)
}

// Update is an executor's report.
type Update struct {
	TaskID          store.TaskID
	Status          store.TaskStatus // running, succeeded, failed or cancelled
	ExitCode        *int
	Output          []byte
	OutputTruncated bool
	ErrorMessage    string
	Progress        string
}

// ErrNotYours means an executor reported on a task it does not hold.
var ErrNotYours = errors.New("task belongs to another instance")

// ApplyAgentUpdate records an agent's report on its own task. Running
// renews the lease; the rest end the task.
func (s *Service) ApplyAgentUpdate(ctx context.Context, instanceID store.InstanceID, u Update) (*store.Task, error) {
	if u.TaskID == "" {
		return nil, fail.Invalid("task_update.task_id", "required")
	}
	var t *store.Task
	var finished bool
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		var err error
		if t, err = q.LockTask(ctx, u.TaskID); err != nil {
			return err
		}
		if t.InstanceID != instanceID || t.Target != store.TaskTargetAgent {
			return fmt.Errorf("task %s: %w", u.TaskID, ErrNotYours)
		}
		if t.Terminal() {
			return nil // a late or repeated report; the first final word stands
		}
		now := s.Clock.Now()
		t.UpdatedAt = now
		if u.Progress != "" {
			t.Progress = truncate(u.Progress, 1024)
		}
		switch u.Status {
		case store.TaskRunning:
			until := now.Add(s.lease())
			t.Status, t.LeaseOwner, t.LeaseExpiresAt = store.TaskRunning, Owner(instanceID), &until
		case store.TaskSucceeded, store.TaskFailed, store.TaskCancelled:
			t.Status, t.LeaseExpiresAt = u.Status, nil
			t.ExitCode = u.ExitCode
			out, cut := u.Output, u.OutputTruncated
			if len(out) > s.MaxOutput() {
				out, cut = out[:s.MaxOutput()], true
			}
			t.Output, t.OutputTruncated = out, cut
			t.ErrorMessage = truncate(u.ErrorMessage, 4096)
			finished = true
		default:
			return fail.Invalid("task_update.status", "%q is not a status an executor reports", u.Status)
		}
		if err := q.UpdateTask(ctx, t); err != nil {
			return err
		}
		if finished {
			sev := events.Low
			if t.Status == store.TaskFailed {
				sev = events.Medium
			}
			_, err = events.E{Kind: events.TaskFinished, Severity: sev, InstanceID: instanceID, CorrelationID: t.ID.Correlation(),
				Message: fmt.Sprintf("%s task %s %s", t.Kind, t.ID, t.Status),
				Payload: events.AgentTaskFinishedPayload{Error: t.ErrorMessage, ExitCode: t.ExitCode, Status: t.Status}}.Write(ctx, q, now)
		}
		return err
	})
	return t, err
}

// ExpireLeases returns lapsed leases to pending (or fails them past their
// attempts) and wakes the streams of the instances concerned.
func (s *Service) ExpireLeases(ctx context.Context) (int, error) {
	var changed []*store.Task
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		var err error
		if changed, err = q.ExpireTaskLeases(ctx, s.Clock.Now()); err != nil {
			return err
		}
		for _, t := range changed {
			if t.Status == store.TaskPending && t.Target == store.TaskTargetAgent {
				if err := q.Notify(ctx, store.ChannelTasks, t.InstanceID.String()); err != nil {
					return err
				}
			}
		}
		return nil
	})
	for _, t := range changed {
		s.Log.Info("task lease expired", "task", t.ID, "instance", t.InstanceID, "now", t.Status, "attempts", t.Attempts)
	}
	return len(changed), err
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
