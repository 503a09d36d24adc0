package retention

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/internal/clock"
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// The retention tick prunes old events, finished tasks, expired tokens and
// expired certificates, and nothing live.
func TestRetentionTick(t *testing.T) {
	ctx := context.Background()
	st := openSQLite(t)
	now := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	long := now.Add(-400 * 24 * time.Hour)
	if err := st.AppendEvent(ctx, &store.Event{Kind: "old", Severity: store.SeverityCritical, CreatedAt: long}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateToken(ctx, &store.Token{Hash: "spent", InstanceID: "i", ExpiresAt: long, CreatedAt: long}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateToken(ctx, &store.Token{Hash: "live", InstanceID: "i", ExpiresAt: now.Add(time.Hour), CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := New(st, clock.NewFake(now), discard, Policy{}, Batch).Tick(ctx); err != nil {
		t.Fatal(err)
	}
	if evs, _ := st.ListEvents(ctx, store.EventFilter{}, store.Page{}); len(evs) != 0 {
		t.Fatalf("a 400-day-old critical event survived: %v", evs)
	}
	if _, err := st.GetToken(ctx, "spent"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("an expired token survived: %v", err)
	}
	if _, err := st.GetToken(ctx, "live"); err != nil {
		t.Fatalf("a live token was pruned: %v", err)
	}
}

// seedOldEvents writes n low-severity events 400 days old in one statement.
func seedOldEvents(tb testing.TB, st *sqlite.Store, n int, now time.Time) {
	tb.Helper()
	if _, err := st.SQL().ExecContext(context.Background(), `WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < ?)
		INSERT INTO events (kind, severity, instance_id, pool_id, correlation_id, message, payload, created_at)
		SELECT 'instance.transition', 0, 'i-' || (x % 100000), '', 'c-' || x, 'instance moved from booting to running', '{}', ? + x FROM c`,
		n, now.Add(-400*24*time.Hour).UnixMicro()); err != nil {
		tb.Fatal(err)
	}
}

// countedTx counts the store's transactions.
type countedTx struct {
	store.Store
	n int
}

func (c *countedTx) Tx(ctx context.Context, fn func(store.Queries) error) error {
	c.n++
	return c.Store.Tx(ctx, fn)
}

// A backlog is pruned in transactions of Batch rows, never in one
// that would hold SQLite's writer for as long as the whole backlog takes.
func TestRetentionPrunesInBatches(t *testing.T) {
	ctx := context.Background()
	st := openSQLite(t)
	now := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	seedOldEvents(t, st, 2*Batch+5, now)
	c := &countedTx{Store: st}
	if err := New(c, clock.NewFake(now), discard, Policy{}, Batch).Tick(ctx); err != nil {
		t.Fatal(err)
	}
	// Three for the events (two full batches and the rest), one each for
	// the other records and the audit trail, which have nothing to prune.
	if c.n != 5 {
		t.Fatalf("%d transactions for %d events, want 3 of at most %d and 2 more", c.n, 2*Batch+5, Batch)
	}
	if evs, _ := st.ListEvents(ctx, store.EventFilter{}, store.Page{Limit: 1}); len(evs) != 0 {
		t.Fatalf("an old event survived: %v", evs[0])
	}
}

// BenchmarkRetentionBesideWrites prunes a backlog of old events while
// another writer commits every 5 ms, and reports the longest that writer
// waited: with one transaction it waits for the whole backlog.
func BenchmarkRetentionBesideWrites(b *testing.B) {
	const backlog = 200_000
	for _, bc := range []struct {
		name  string
		batch int
	}{{"one-transaction", 0}, {"batches", Batch}} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			var worst time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				st := openSQLite(b)
				now := time.Now()
				seedOldEvents(b, st, backlog, now)
				pruner := New(st, clock.NewFake(now), discard, Policy{}, bc.batch)
				stop, done := make(chan struct{}), make(chan error, 1)
				go func() {
					tick := time.NewTicker(5 * time.Millisecond)
					defer tick.Stop()
					for {
						select {
						case <-stop:
							done <- nil
							return
						case <-tick.C:
						}
						t0 := time.Now()
						err := st.Tx(ctx, func(q store.Queries) error {
							return q.AppendEvent(ctx, &store.Event{Kind: "bench.write", CreatedAt: now})
						})
						if err != nil {
							done <- err
							return
						}
						worst = max(worst, time.Since(t0))
					}
				}()
				b.StartTimer()
				err := pruner.Tick(ctx)
				b.StopTimer()
				close(stop)
				if werr := <-done; werr != nil {
					b.Fatalf("a write beside the prune failed: %v", werr)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(worst.Microseconds())/1000, "worst-write-wait-ms")
		})
	}
}

// openSQLite is a fresh store in the test's temp dir, closed at its end.
func openSQLite(tb testing.TB) *sqlite.Store {
	tb.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(tb.TempDir(), "tether.db"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { st.Close() })
	return st
}
