package postgres_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/postgres"
	"github.com/tetherfleet/tether/internal/testkit/logbuf"
	"github.com/tetherfleet/tether/internal/testkit/pgtest"
)

// syncBuffer is a log sink the test can read while the store writes.
type syncBuffer = logbuf.Buffer

// A PostgreSQL restart under load: calls during the outage fail with
// ErrUnavailable, the store recovers by itself (pool, listener, elector),
// and nothing acknowledged before, during or after is lost.
func TestRestartUnderLoad(t *testing.T) {
	srv := pgtest.StartServer(t, pgtest.Options{})
	dsn := pgtest.NewDatabase(t, srv)
	var logs syncBuffer
	o := fastOpts
	o.Log = slog.New(slog.NewTextHandler(&logs, nil))
	s := open(t, dsn, o)
	ctx := ctxT(t, 120*time.Second)
	events, stopEvents := s.Subscribe(store.ChannelEvents)
	defer stopEvents()

	var (
		mu          sync.Mutex
		acked       []store.TaskID
		unavailable int
		failedAfter int          // refused after the server was back up
		okAfter     atomic.Int64 // successes since the restart finished
		restarted   atomic.Bool
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				tk := workerTask(i)
				err := s.Tx(ctx, func(q store.Queries) error {
					if err := q.CreateTask(ctx, tk); err != nil {
						return err
					}
					return q.AppendEvent(ctx, &store.Event{Kind: "task.created", Severity: 1, CorrelationID: tk.ID.Correlation(), CreatedAt: t0})
				})
				mu.Lock()
				switch {
				case err == nil:
					acked = append(acked, tk.ID)
					if restarted.Load() {
						okAfter.Add(1)
					}
				case errors.Is(err, store.ErrUnavailable):
					unavailable++
					if restarted.Load() {
						failedAfter++
					}
				default:
					t.Errorf("writer %d: an outage must read as ErrUnavailable, got: %v", w, err)
				}
				mu.Unlock()
				if err != nil {
					time.Sleep(20 * time.Millisecond) // writers retry against a restarting PostgreSQL
				}
			}
		}(w)
	}

	time.Sleep(500 * time.Millisecond) // let the writers run against PostgreSQL before stopping it
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	// During the outage: a read fails fast, as Unavailable, saying why.
	_, err := s.GetTask(ctx, "whatever")
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("a read during the outage: got %v, want ErrUnavailable", err)
	}
	t.Logf("during the outage: %v", err)
	time.Sleep(time.Second) // keep PostgreSQL down for a while
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	restarted.Store(true)
	restartedAt := time.Now()
	for okAfter.Load() < 50 {
		if time.Since(restartedAt) > 20*time.Second {
			t.Fatalf("writers did not recover within 20s of the restart (%d successes)", okAfter.Load())
		}
		time.Sleep(10 * time.Millisecond) // polls the writers recovering after PostgreSQL restarts
	}
	t.Logf("writers recovered %s after the restart", time.Since(restartedAt).Round(time.Millisecond))
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	if unavailable == 0 {
		t.Fatal("no call failed during the outage: did the server really stop?")
	}
	stored := map[store.TaskID]bool{}
	for after := ""; ; {
		page, err := s.ListTasks(ctx, store.TaskFilter{}, store.Page{Limit: store.MaxPageSize, After: after})
		if err != nil {
			t.Fatal(err)
		}
		for _, tk := range page {
			stored[tk.ID] = true
		}
		if len(page) < store.MaxPageSize {
			break
		}
		after = page[len(page)-1].ID.String()
	}
	for _, id := range acked {
		if !stored[id] {
			t.Fatalf("task %s was acknowledged but is gone after the restart", id)
		}
	}
	t.Logf("%d writes acknowledged and kept, %d refused as unavailable (%d of them after the server was back)", len(acked), unavailable, failedAfter)

	// The listener is back by itself: a new event reaches the old
	// subscription. (Notifications committed before it reconnected are
	// lost by design; subscribers also poll.) The buffer is drained first:
	// the load filled it, and a full subscriber drops notifications.
	back := false
	for deadline := time.Now().Add(15 * time.Second); !back && time.Now().Before(deadline); {
		for len(events) > 0 {
			<-events
		}
		e := &store.Event{Kind: "after.restart", Severity: 1, CreatedAt: t0}
		if err := s.AppendEvent(ctx, e); err != nil {
			t.Fatal(err)
		}
		back = recvOK(events, strconv.FormatInt(e.ID, 10), time.Second)
	}
	if !back {
		t.Fatalf("no notification after the restart; log:\n%s", logs.String())
	}
	// The elector works again.
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, release, err := s.Elector().Campaign(cctx, "after-restart")
	if err != nil {
		t.Fatalf("campaign after the restart: %v", err)
	}
	release()
	if !strings.Contains(logs.String(), "notification listener reconnected") {
		t.Errorf("the listener did not log its reconnect:\n%s", logs.String())
	}
}

// Open waits for a server that is not up yet, saying so in the log, and
// gives up after WaitFor with ErrUnavailable.
func TestOpenWaitsForTheServer(t *testing.T) {
	srv := pgtest.StartServer(t, pgtest.Options{})
	dsn := pgtest.NewDatabase(t, srv)
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 60*time.Second)

	_, err := postgres.Open(ctx, dsn, postgres.Options{WaitFor: 700 * time.Millisecond})
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "not reachable") {
		t.Fatalf("Open with the server down: got %v, want ErrUnavailable saying it is not reachable", err)
	}

	var logs syncBuffer
	opened := make(chan error, 1)
	go func() {
		s, err := postgres.Open(ctx, dsn, postgres.Options{WaitFor: 30 * time.Second, Log: slog.New(slog.NewTextHandler(&logs, nil))})
		if err == nil {
			s.Close()
		}
		opened <- err
	}()
	time.Sleep(1500 * time.Millisecond) // PostgreSQL stays down while Open retries
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	if err := <-opened; err != nil {
		t.Fatalf("Open did not wait for the server: %v", err)
	}
	if !strings.Contains(logs.String(), "waiting for PostgreSQL at host="+srv.Dir) || !strings.Contains(logs.String(), "retrying in") {
		t.Fatalf("no clear waiting line in the log:\n%s", logs.String())
	}

	// A database that does not exist is not worth waiting for.
	start := time.Now()
	_, err = postgres.Open(ctx, srv.DSN("no_such_db"), postgres.Options{WaitFor: 30 * time.Second})
	if err == nil || errors.Is(err, store.ErrUnavailable) || time.Since(start) > 5*time.Second {
		t.Fatalf("Open of a missing database: got %v after %s, want a prompt permanent error", err, time.Since(start))
	}
}

func recvOK(ch <-chan string, want string, within time.Duration) bool {
	deadline := time.After(within)
	for {
		select {
		case got := <-ch:
			if got == want {
				return true
			}
		case <-deadline:
			return false
		}
	}
}

// After a restart quicker than the pool's idle ping (1 s), every pooled
// connection is dead but looks fine. The first call that trips over one
// empties the pool, so it is the only call that fails.
func TestQuickRestartCostsOneCall(t *testing.T) {
	srv := pgtest.StartServer(t, pgtest.Options{})
	s := open(t, pgtest.NewDatabase(t, srv), fastOpts)
	ctx := ctxT(t, 60*time.Second)
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ { // fill the pool with connections
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = s.Tx(ctx, func(q store.Queries) error {
				_, err := q.LatestEventID(ctx)
				time.Sleep(20 * time.Millisecond) // holds the transaction open in a real PostgreSQL
				return err
			})
		}()
	}
	wg.Wait()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	failed := 0
	for i := 0; i < 16; i++ {
		if _, err := s.LatestEventID(ctx); err != nil {
			if !errors.Is(err, store.ErrUnavailable) {
				t.Fatalf("a stale connection must read as ErrUnavailable: %v", err)
			}
			failed++
		}
	}
	if failed > 1 {
		t.Fatalf("%d calls failed after the server was back, want at most 1", failed)
	}
}
