package agenthub

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
)

// countingStore counts the reads a sweep could make.
type countingStore struct {
	store.Store
	sweeps, lists atomic.Int64
}

func (c *countingStore) ListInstancesWithAgentWork(ctx context.Context) ([]store.InstanceID, error) {
	c.sweeps.Add(1)
	return c.Store.ListInstancesWithAgentWork(ctx)
}

func (c *countingStore) ListTasks(ctx context.Context, f store.TaskFilter, p store.Page) ([]*store.Task, error) {
	c.lists.Add(1)
	return c.Store.ListTasks(ctx, f, p)
}

// testConn is a registered stream that records its wake-ups.
type testConn struct{ woke chan struct{} }

func registerTest(h *Hub, id store.InstanceID) *testConn {
	c := &testConn{woke: make(chan struct{}, 1)}
	h.Register(id, func() {
		select {
		case c.woke <- struct{}{}:
		default:
		}
	}, func() {})
	return c
}

func woken(c *testConn) bool {
	select {
	case <-c.woke:
		return true
	default:
		return false
	}
}

// One sweep query wakes exactly the connected streams with work, however
// many streams are open, and reads no stream's tasks one by one.
func TestSweepWakesOnlyStreamsWithWork(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	st := &countingStore{Store: db}
	hub := New(Config{Store: st, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Flush: time.Second})

	if n, err := hub.SweepWork(ctx); err != nil || n != 0 || st.sweeps.Load() != 0 {
		t.Fatalf("sweep with no streams: woke %d, %v, %d queries; want no query at all", n, err, st.sweeps.Load())
	}
	conns := map[store.InstanceID]*testConn{}
	for _, id := range []store.InstanceID{"idle-1", "idle-2", "idle-3", "has-task", "has-cancel"} {
		conns[id] = registerTest(hub, id)
	}
	now := time.Now()
	add := func(instance store.InstanceID, status store.TaskStatus, cancel bool) {
		tk := &store.Task{Target: store.TaskTargetAgent, InstanceID: instance, Kind: "reboot", Payload: []byte(`{}`),
			Status: status, MaxAttempts: 1, CancelRequested: cancel, CreatedAt: now, UpdatedAt: now}
		if status == store.TaskRunning {
			until := now.Add(time.Minute)
			tk.LeaseOwner, tk.LeaseExpiresAt = "agent:"+instance.String(), &until
		}
		if err := db.CreateTask(ctx, tk); err != nil {
			t.Fatal(err)
		}
	}
	add("has-task", store.TaskPending, false)
	add("has-cancel", store.TaskRunning, true)
	add("idle-1", store.TaskRunning, false)    // leased work with nothing to relay
	add("elsewhere", store.TaskPending, false) // its stream is on another replica

	n, err := hub.SweepWork(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 || st.sweeps.Load() != 1 || st.lists.Load() != 0 {
		t.Fatalf("sweep woke %d streams with %d sweep queries and %d per-stream reads; want 2, 1, 0", n, st.sweeps.Load(), st.lists.Load())
	}
	for id, c := range conns {
		want := id == "has-task" || id == "has-cancel"
		if got := woken(c); got != want {
			t.Errorf("stream %s woken = %v, want %v", id, got, want)
		}
	}
}

// blockingTx holds its first transaction until released; later ones (a
// batch put back after the first failed, the last flush) pass.
type blockingTx struct {
	store.Store
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (b *blockingTx) Tx(ctx context.Context, fn func(store.Queries) error) error {
	b.once.Do(func() {
		b.entered <- struct{}{}
		<-b.release
	})
	return b.Store.Tx(ctx, fn)
}

// A task's notification reaches its stream while a heartbeat batch is
// still being written: the two do not wait on each other.
func TestNotificationIsNotHeldBehindAHeartbeatFlush(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	st := &blockingTx{Store: db, entered: make(chan struct{}), release: make(chan struct{})}
	hub := New(Config{Store: st, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Flush: time.Millisecond})
	c := registerTest(hub, "i-1")
	hub.Heartbeat(store.Heartbeat{InstanceID: "i-1", At: time.Now(), Phase: "ready"})
	runCtx, stopRun := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); hub.Run(runCtx) }()
	<-st.entered // the flush is now stuck in its transaction
	if err := db.Tx(ctx, func(q store.Queries) error { return q.Notify(ctx, store.ChannelTasks, "i-1") }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.woke:
	case <-ctx.Done():
		t.Fatal("the stream was not woken while a heartbeat flush was in its transaction")
	}
	close(st.release)
	stopRun()
	<-done
}

// The hub announces each doubling of the fleet past 500 streams, once,
// and never a shrink: streams resend their settings on the announcement.
func TestGrownAnnouncesEachDoubling(t *testing.T) {
	h := New(Config{Log: slog.New(slog.DiscardHandler), Flush: time.Second})
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	conns := map[store.InstanceID]*Conn{}
	next := 0
	connect := func(from, to int) {
		for range to - from {
			next++
			id := store.InstanceID(fmt.Sprintf("i-%d", next))
			conns[id] = h.Register(id, func() {}, func() {})
		}
	}
	for _, tc := range []struct {
		name     string
		to       int // streams open after the step (from the previous step's count)
		announce bool
	}{
		{"below one second's worth", 499, false},
		{"reaches 500", 500, true},
		{"on to 999", 999, false},
		{"doubles to 1,000", 1000, true},
		{"shrinks to 10", 10, false},
		{"back to 1,999", 1999, false},
		{"doubles again to 2,000", 2000, true},
	} {
		ch := h.Grown()
		if n := len(conns); tc.to >= n {
			connect(n, tc.to)
		} else {
			for id, c := range conns {
				if len(conns) == tc.to {
					break
				}
				h.Unregister(id, c)
				delete(conns, id)
			}
		}
		if got := closed(ch); got != tc.announce {
			t.Fatalf("%s (%d streams): announced = %v, want %v", tc.name, h.Connected(), got, tc.announce)
		}
		if tc.announce && closed(h.Grown()) {
			t.Fatalf("%s: the next announcement is already made", tc.name)
		}
	}
}
