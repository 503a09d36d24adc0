package worker_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/controlplane/worker"
	"github.com/tetherfleet/tether/internal/clock"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

type fixture struct {
	ctx context.Context
	st  store.Store
	clk clock.Clock
}

func setup(t *testing.T, clk clock.Clock) fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "t.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	// Tasks reference an instance.
	now := clk.Now()
	tpl := &store.Template{Name: "tpl", CreatedAt: now, UpdatedAt: now}
	node := &store.Node{Name: "n", Enabled: true, Config: []byte("{}"), CreatedAt: now, UpdatedAt: now}
	in := &store.Instance{ID: "i1", Status: lifecycle.Pending, Provider: "fake", CreatedAt: now, UpdatedAt: now}
	if err := st.CreateTemplate(ctx, tpl); err != nil {
		t.Fatal(err)
	}
	node.TemplateID = tpl.ID
	if err := st.CreateNode(ctx, node); err != nil {
		t.Fatal(err)
	}
	in.NodeID = node.ID
	if err := st.CreateInstance(ctx, in); err != nil {
		t.Fatal(err)
	}
	return fixture{ctx, st, clk}
}

func (f fixture) enqueue(t *testing.T, kind string) *store.Task {
	t.Helper()
	task := &store.Task{InstanceID: "i1", Kind: store.TaskKind(kind), CreatedAt: f.clk.Now(), UpdatedAt: f.clk.Now()}
	if err := f.st.Tx(f.ctx, func(q store.Queries) error { return worker.Enqueue(f.ctx, q, task) }); err != nil {
		t.Fatal(err)
	}
	return task
}

func (f fixture) task(t *testing.T, id store.TaskID) *store.Task {
	t.Helper()
	task, err := f.st.GetTask(f.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return task
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestOutcomes(t *testing.T) {
	tests := []struct {
		name    string
		kind    string
		handler worker.Handler
		status  store.TaskStatus
		errText string
	}{
		{"success", "ok", func(context.Context, *store.Task) error { return nil }, store.TaskSucceeded, ""},
		{"failure keeps the reason", "bad", func(context.Context, *store.Task) error { return errors.New("provider said no") }, store.TaskFailed, "provider said no"},
		{"unknown kind fails at once", "mystery", nil, store.TaskFailed, `no worker handles "mystery"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := setup(t, clock.Real{})
			task := f.enqueue(t, tc.kind)
			w := &worker.Worker{Store: f.st, Clock: f.clk, Log: discard(), Owner: "w", Handlers: map[store.TaskKind]worker.Handler{}}
			if tc.handler != nil {
				w.Handlers[store.TaskKind(tc.kind)] = tc.handler
			}
			if ran, err := w.RunOnce(f.ctx); !ran || err != nil {
				t.Fatalf("%v %v", ran, err)
			}
			got := f.task(t, task.ID)
			if got.Status != tc.status || !strings.Contains(got.ErrorMessage, tc.errText) || got.LeaseExpiresAt != nil {
				t.Fatalf("task %s %q lease %v", got.Status, got.ErrorMessage, got.LeaseExpiresAt)
			}
		})
	}
}

// A long handler keeps its lease: Hold renews it on the injected clock's
// ticker, every third of the lease, so that however far the clock moves
// while the handler runs, the lease never lapses under it.
func TestLeaseIsRenewedWhileRunning(t *testing.T) {
	clk := clock.NewFake(t0)
	f := setup(t, clk)
	task := f.enqueue(t, "slow")
	const lease = 90 * time.Second
	renewed := &txSignal{Store: f.st, done: make(chan struct{}, 1)}
	w := &worker.Worker{Store: renewed, Clock: clk, Log: discard(), Owner: "w", Lease: lease, Handlers: map[store.TaskKind]worker.Handler{
		"slow": func(ctx context.Context, _ *store.Task) error {
			renewed.armed.Store(true)
			defer renewed.armed.Store(false)
			// Eight thirds of a lease: without renewals it lapses on the
			// third step.
			for i := range 8 {
				if err := clk.BlockUntilPending(ctx, func(p []time.Duration) bool { return slices.Contains(p, lease/3) }); err != nil {
					return fmt.Errorf("step %d: no renewal ticker of a third of the lease: %w", i, err)
				}
				clk.Advance(lease / 3)
				select {
				case <-renewed.done:
				case <-time.After(10 * time.Second):
					return fmt.Errorf("step %d: the lease was not renewed when the clock passed a third of it", i)
				}
				ts, err := f.st.ExpireTaskLeases(ctx, clk.Now())
				if err != nil {
					return err
				}
				if len(ts) != 0 {
					return fmt.Errorf("step %d: the lease expired under a live handler", i)
				}
			}
			return nil
		}}}
	if _, err := w.RunOnce(f.ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.task(t, task.ID); got.Status != store.TaskSucceeded || got.Attempts != 0 {
		t.Fatalf("task %s after %d attempts: %s", got.Status, got.Attempts, got.ErrorMessage)
	}
}

// A handler whose lease passed to another worker is told to stop and does
// not write the task's end.
func TestLostLeaseStopsTheHandler(t *testing.T) {
	f := setup(t, clock.Real{})
	task := f.enqueue(t, "slow")
	lease := 90 * time.Millisecond
	stolen := make(chan struct{})
	w := &worker.Worker{Store: f.st, Clock: f.clk, Log: discard(), Owner: "w", Lease: lease, Handlers: map[store.TaskKind]worker.Handler{
		"slow": func(ctx context.Context, t2 *store.Task) error {
			// Another worker takes the task over.
			cur, _ := f.st.GetTask(ctx, t2.ID)
			cur.LeaseOwner = "someone-else"
			if err := f.st.UpdateTask(ctx, cur); err != nil {
				return err
			}
			close(stolen)
			<-ctx.Done()
			if !errors.Is(context.Cause(ctx), worker.ErrLeaseLost) {
				return errors.New("cancelled for the wrong reason")
			}
			return ctx.Err()
		}}}
	if _, err := w.RunOnce(f.ctx); err != nil {
		t.Fatal(err)
	}
	<-stolen
	if got := f.task(t, task.ID); got.Status != store.TaskRunning || got.LeaseOwner != "someone-else" {
		t.Fatalf("the old owner wrote over the new one's task: %s %s", got.Status, got.LeaseOwner)
	}
}

func TestCancelRequestedStopsTheHandler(t *testing.T) {
	f := setup(t, clock.Real{})
	task := f.enqueue(t, "slow")
	w := &worker.Worker{Store: f.st, Clock: f.clk, Log: discard(), Owner: "w", Lease: 90 * time.Millisecond, Handlers: map[store.TaskKind]worker.Handler{
		"slow": func(ctx context.Context, t2 *store.Task) error {
			cur, _ := f.st.GetTask(ctx, t2.ID)
			cur.CancelRequested = true
			if err := f.st.UpdateTask(ctx, cur); err != nil {
				return err
			}
			<-ctx.Done()
			return context.Cause(ctx)
		}}}
	if _, err := w.RunOnce(f.ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.task(t, task.ID); got.Status != store.TaskCancelled {
		t.Fatalf("task %s %q", got.Status, got.ErrorMessage)
	}
}

// txSignal reports on done each time a transaction ends, once armed.
type txSignal struct {
	store.Store
	armed atomic.Bool
	done  chan struct{}
}

func (s *txSignal) Tx(ctx context.Context, fn func(store.Queries) error) error {
	err := s.Store.Tx(ctx, fn)
	if s.armed.Load() {
		s.done <- struct{}{}
	}
	return err
}

// Run wakes on the notification channel: a task runs without waiting for
// the poll.
func TestRunWakesOnEnqueue(t *testing.T) {
	f := setup(t, clock.Real{})
	done := make(chan store.TaskID, 1)
	// Run's first claim ends (finding nothing) after it has subscribed;
	// a task enqueued after that can only be found through the wake.
	claimed := &txSignal{Store: f.st, done: make(chan struct{}, 1)}
	claimed.armed.Store(true)
	w := &worker.Worker{Store: claimed, Clock: f.clk, Log: discard(), Owner: "w", Poll: time.Hour, Handlers: map[store.TaskKind]worker.Handler{
		"ping": func(_ context.Context, t2 *store.Task) error { done <- t2.ID; return nil }}}
	ctx, stop := context.WithCancel(f.ctx)
	stopped := make(chan struct{})
	go func() { w.Run(ctx); close(stopped) }()
	defer func() { stop(); <-stopped }()
	select {
	case <-claimed.done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run never tried to claim a task")
	}
	claimed.armed.Store(false)
	task := f.enqueue(t, "ping")
	select {
	case id := <-done:
		if id != task.ID {
			t.Fatalf("ran %s", id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the worker did not wake for a new task")
	}
}

// deaf drops the worker's wake-ups, so that only the poll can find a task.
type deaf struct{ *txSignal }

func (deaf) Subscribe(string) (<-chan string, func()) { return make(chan string), func() {} }

// Run's poll, the safety net behind a lost notification, ticks on the
// injected clock: a task nobody announced runs once the clock has moved by
// Poll, and not before.
func TestRunPollsOnTheClock(t *testing.T) {
	clk := clock.NewFake(t0)
	f := setup(t, clk)
	const poll = 7 * time.Second
	claimed := &txSignal{Store: f.st, done: make(chan struct{}, 1)}
	claimed.armed.Store(true)
	done := make(chan store.TaskID, 1)
	w := &worker.Worker{Store: deaf{claimed}, Clock: clk, Log: discard(), Owner: "w", Poll: poll, Handlers: map[store.TaskKind]worker.Handler{
		"ping": func(_ context.Context, t2 *store.Task) error { done <- t2.ID; return nil }}}
	ctx, stop := context.WithCancel(f.ctx)
	stopped := make(chan struct{})
	go func() { w.Run(ctx); close(stopped) }()
	defer func() { stop(); <-stopped }()
	<-claimed.done // the first claim found nothing
	claimed.armed.Store(false)
	task := f.enqueue(t, "ping")
	if err := clk.BlockUntilPending(f.ctx, func(p []time.Duration) bool { return slices.Contains(p, poll) }); err != nil {
		t.Fatalf("Run does not poll on the clock: %v", err)
	}
	select {
	case id := <-done:
		t.Fatalf("ran %s before the poll: the wake-up was to be lost", id)
	default:
	}
	clk.Advance(poll)
	select {
	case id := <-done:
		if id != task.ID {
			t.Fatalf("ran %s", id)
		}
	case <-f.ctx.Done():
		t.Fatal("the poll did not find the task")
	}
}
