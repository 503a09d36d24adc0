// Package worker runs the control plane's own tasks (target "worker"): the
// provider work behind provisioning and the power operations. Tasks are
// leased from the store and the lease is renewed while a handler runs, so a
// worker that dies mid-task loses nothing: its lease lapses, the lease
// loop returns the task to pending, and a worker on any replica retries it.
// Handlers must therefore be idempotent, which the providers are by
// instance id.
package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/clock"
)

// Channel wakes workers: Enqueue notifies it when a task is created. A
// dropped notification only delays a task until the next poll.
const Channel = "tether_worker"

// Defaults.
const (
	DefaultLease       = 60 * time.Second
	DefaultPoll        = 5 * time.Second
	DefaultConcurrency = 4
	DefaultMaxAttempts = 3
)

// ErrLeaseLost means the task's lease passed to someone else (it expired
// and another worker took the task) while a handler ran. The handler's
// context is cancelled with it; whatever it was doing is the new owner's.
var ErrLeaseLost = errors.New("task lease lost")

// ErrCancelled means an operator cancelled the task while it ran.
var ErrCancelled = errors.New("task cancelled")

// Handler runs one task. It may end the task itself inside its own
// transaction (with Finish), so that the task's outcome commits together
// with the state change it caused; a task the handler left open is
// finished from its return value.
type Handler func(ctx context.Context, t *store.Task) error

// Worker leases and runs worker tasks.
type Worker struct {
	Store store.Store
	Clock clock.Clock
	Log   *slog.Logger
	// Owner names this worker in task leases; unique per replica.
	Owner       string
	Lease       time.Duration // zero: DefaultLease
	Poll        time.Duration // zero: DefaultPoll
	Concurrency int           // zero: DefaultConcurrency
	// Handlers by task kind. A task of another kind fails at once with a
	// message, rather than sitting leased until its attempts run out.
	Handlers map[store.TaskKind]Handler
}

// NewOwner returns a lease owner id unique to this process.
func NewOwner(role string) string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s:%s:%d:%s", role, host, os.Getpid(), hex.EncodeToString(b))
}

func (w *Worker) lease() time.Duration { return orDefault(w.Lease, DefaultLease) }

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// Run leases and runs tasks until ctx ends. It wakes on Channel and polls,
// and runs up to Concurrency tasks at once. Handlers still running when
// ctx ends are cancelled and their tasks left leased: the lease expiry
// hands them to the next worker, which is what a crash would do too.
func (w *Worker) Run(ctx context.Context) {
	wake, stop := w.Store.Subscribe(Channel)
	defer stop()
	poll := w.Clock.NewTicker(orDefault(w.Poll, DefaultPoll))
	defer poll.Stop()
	n := w.Concurrency
	if n <= 0 {
		n = DefaultConcurrency
	}
	done := make(chan struct{}, n)
	running := 0
	defer func() {
		for ; running > 0; running-- {
			<-done
		}
	}()
	for {
		for running < n {
			t, err := w.claim(ctx)
			if err != nil {
				if ctx.Err() == nil {
					w.Log.Warn("worker: claim task", "err", err)
				}
				break
			}
			if t == nil {
				break
			}
			running++
			go func() {
				defer func() { done <- struct{}{} }()
				w.run(ctx, t)
			}()
		}
		select {
		case <-ctx.Done():
			return
		case <-done:
			running--
		case <-wake:
		case <-poll.C():
		}
	}
}

// RunOnce leases one pending task and runs it to the end. It reports
// whether there was a task. Tests drive workers with it.
func (w *Worker) RunOnce(ctx context.Context) (bool, error) {
	t, err := w.claim(ctx)
	if err != nil || t == nil {
		return false, err
	}
	w.run(ctx, t)
	return true, nil
}

func (w *Worker) claim(ctx context.Context) (*store.Task, error) {
	now := w.Clock.Now()
	var t *store.Task
	err := w.Store.Tx(ctx, func(q store.Queries) error {
		var err error
		t, err = q.ClaimTask(ctx, store.TaskClaim{Target: store.TaskTargetWorker, Owner: w.Owner, Now: now, LeaseUntil: now.Add(w.lease())})
		return err
	})
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	return t, err
}

func (w *Worker) run(ctx context.Context, t *store.Task) {
	log := w.Log.With("task", t.ID, "kind", t.Kind, "instance", t.InstanceID, "attempt", t.Attempts+1)
	h, ok := w.Handlers[t.Kind]
	if !ok {
		herr := fmt.Errorf("no worker handles %q tasks", t.Kind)
		if _, err := FinishTx(ctx, w.Store, w.Clock, t, herr); err != nil {
			log.Warn("worker: finish task", "err", err)
		}
		return
	}
	log.Info("worker: running task")
	herr := Hold(ctx, w.Store, w.Clock, t, w.lease(), func(hctx context.Context) error { return h(hctx, t) })
	switch {
	case ctx.Err() != nil:
		// This worker is stopping: leave the task leased so that lease
		// expiry retries it, exactly as after a crash.
		log.Info("worker: stopping with the task unfinished; its lease will expire and it will be retried")
		return
	case errors.Is(herr, ErrLeaseLost):
		log.Warn("worker: lost the task's lease while running it", "err", herr)
		return
	}
	ended, err := FinishTx(ctx, w.Store, w.Clock, t, herr)
	if err != nil {
		log.Warn("worker: finish task", "err", err)
		return
	}
	switch {
	case herr != nil:
		log.Warn("worker: task failed", "err", herr)
	case ended:
		log.Info("worker: task succeeded")
	default:
		log.Info("worker: task done")
	}
}

// Hold runs fn while holding t's lease: it marks the task running, renews
// the lease every third of its length and cancels fn's context when the
// lease is lost or the task is cancelled. It returns fn's error, joined
// with ErrLeaseLost or ErrCancelled when that is why fn was stopped.
func Hold(ctx context.Context, st store.Store, clk clock.Clock, t *store.Task, lease time.Duration, fn func(context.Context) error) error {
	lease = orDefault(lease, DefaultLease)
	hctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if err := renew(ctx, st, clk, t, lease); err != nil {
		return errors.Join(err, ctx.Err())
	}
	stop := make(chan struct{})
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		tick := clk.NewTicker(lease / 3)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-hctx.Done():
				return
			case <-tick.C():
				if err := renew(hctx, st, clk, t, lease); err != nil {
					if errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrCancelled) {
						cancel(err)
						return
					}
					// A store hiccup: keep going, the lease has two
					// more renewals of slack.
				}
			}
		}
	}()
	err := fn(hctx)
	close(stop)
	<-renewed
	if cause := context.Cause(hctx); ctx.Err() == nil && (errors.Is(cause, ErrLeaseLost) || errors.Is(cause, ErrCancelled)) {
		return errors.Join(err, cause)
	}
	return err
}

// renew extends t's lease if it is still ours, and marks it running.
func renew(ctx context.Context, st store.Store, clk clock.Clock, t *store.Task, lease time.Duration) error {
	return st.Tx(ctx, func(q store.Queries) error {
		cur, err := q.LockTask(ctx, t.ID)
		if err != nil {
			return err
		}
		if cur.LeaseOwner != t.LeaseOwner || cur.Terminal() {
			return fmt.Errorf("task %s: %w (now %s, owner %q)", t.ID, ErrLeaseLost, cur.Status, cur.LeaseOwner)
		}
		if cur.CancelRequested {
			return fmt.Errorf("task %s: %w", t.ID, ErrCancelled)
		}
		now := clk.Now()
		until := now.Add(lease)
		cur.Status, cur.LeaseExpiresAt, cur.UpdatedAt = store.TaskRunning, &until, now
		return q.UpdateTask(ctx, cur)
	})
}

// Enqueue creates t as a pending worker task inside q's transaction and
// wakes the workers once it commits.
func Enqueue(ctx context.Context, q store.Queries, t *store.Task) error {
	t.Target, t.Status = store.TaskTargetWorker, store.TaskPending
	if t.MaxAttempts == 0 {
		t.MaxAttempts = DefaultMaxAttempts
	}
	if len(t.Payload) == 0 {
		t.Payload = []byte("{}")
	}
	if err := q.CreateTask(ctx, t); err != nil {
		return err
	}
	return q.Notify(ctx, Channel, t.ID.String())
}

// NewLeased returns a worker task that its creator runs itself, leased to
// owner from the start so no worker picks it up. Should the creator die,
// the lease lapses and a worker finishes the job.
func NewLeased(instanceID store.InstanceID, kind store.TaskKind, owner string, now time.Time, lease time.Duration) *store.Task {
	until := now.Add(orDefault(lease, DefaultLease))
	return &store.Task{Target: store.TaskTargetWorker, InstanceID: instanceID, Kind: kind, Payload: []byte("{}"),
		Status: store.TaskLeased, LeaseOwner: owner, LeaseExpiresAt: &until, MaxAttempts: DefaultMaxAttempts,
		CreatedAt: now, UpdatedAt: now}
}

// Finish ends t inside q's transaction with herr's outcome (nil:
// succeeded; ErrCancelled: cancelled; else failed with herr's message),
// if t is still leased by the owner that ran it. It reports whether it
// ended the task, and writes task.finished.
func Finish(ctx context.Context, q store.Queries, t *store.Task, herr error, now time.Time) (bool, error) {
	cur, err := q.LockTask(ctx, t.ID)
	if err != nil {
		return false, err
	}
	if cur.Terminal() || cur.LeaseOwner != t.LeaseOwner {
		return false, nil
	}
	cur.Status, cur.ErrorMessage = store.TaskSucceeded, ""
	switch {
	case errors.Is(herr, ErrCancelled):
		cur.Status, cur.ErrorMessage = store.TaskCancelled, Message(herr)
	case herr != nil:
		cur.Status, cur.ErrorMessage = store.TaskFailed, Message(herr)
	}
	cur.LeaseExpiresAt, cur.UpdatedAt = nil, now
	if err := q.UpdateTask(ctx, cur); err != nil {
		return false, err
	}
	*t = *cur
	sev := events.Low
	if cur.Status == store.TaskFailed {
		sev = events.Medium
	}
	_, err = events.E{Kind: events.TaskFinished, Severity: sev, InstanceID: cur.InstanceID, CorrelationID: cur.ID.Correlation(),
		Message: fmt.Sprintf("%s task %s %s", cur.Kind, cur.ID, cur.Status),
		Payload: events.WorkerTaskFinishedPayload{Error: cur.ErrorMessage, Status: cur.Status, Target: cur.Target}}.Write(ctx, q, now)
	return true, err
}

// FinishTx is Finish in its own transaction.
func FinishTx(ctx context.Context, st store.Store, clk clock.Clock, t *store.Task, herr error) (bool, error) {
	var ended bool
	err := st.Tx(ctx, func(q store.Queries) error {
		var err error
		ended, err = Finish(ctx, q, t, herr, clk.Now())
		return err
	})
	return ended, err
}

// Message is the text a task or an instance records for err: a gRPC
// status's message without the "rpc error: code = ..." wrapping.
func Message(err error) string {
	if err == nil {
		return ""
	}
	msg := err.Error()
	if s, ok := status.FromError(err); ok {
		msg = s.Message()
	}
	const max = 4096
	if len(msg) > max {
		msg = msg[:max]
	}
	return msg
}
