package postgres_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/postgres"
)

// inFlightWriter plays an event writer caught between its INSERT and its
// COMMIT: it has drawn an id, which no one can see yet.
func inFlightWriter(t *testing.T, ctx context.Context, dsn string) (pgx.Tx, int64) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, postgres.SerializeEventsSQL); err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := tx.QueryRow(ctx, `INSERT INTO events (kind, severity, instance_id, pool_id, correlation_id, message, payload, created_at)
		VALUES ('late', 1, '', '', '', '', '{}', 0) RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return tx, id
}

// Event writers do not take turns: two can hold the writers' lock at once
// (before, one at a time held it through its commit's WAL flush, which
// capped six replicas at 18-60 event-writing transactions a second).
func TestEventWritersDoNotWaitForEachOther(t *testing.T) {
	dsn := pg.DSN(t)
	open(t, dsn, postgres.Options{}) // migrate
	ctx := ctxT(t, 30*time.Second)
	_, a := inFlightWriter(t, ctx, dsn)
	_, b := inFlightWriter(t, ctx, dsn)
	if b <= a {
		t.Fatalf("second writer drew id %d, not above the first's %d", b, a)
	}
}

// A reader that follows ids never steps over an event whose transaction
// drew its id before a later one committed: it waits for that transaction
// to end, then sees both, in order. So does a watcher that starts "from
// now on".
func TestEventReaderWaitsForAnInFlightWriter(t *testing.T) {
	dsn := pg.DSN(t)
	s := open(t, dsn, postgres.Options{})
	ctx := ctxT(t, 30*time.Second)
	before, err := s.LatestEventID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tx, late := inFlightWriter(t, ctx, dsn)
	later := event("committed", "")
	if err := s.AppendEvent(ctx, later); err != nil {
		t.Fatal(err)
	}
	if later.ID <= late {
		t.Fatalf("committed event got id %d, not above the in-flight %d", later.ID, late)
	}

	read := func(f func() ([]int64, error)) <-chan readResult {
		ch := make(chan readResult, 1)
		go func() { ids, err := f(); ch <- readResult{ids, err} }()
		return ch
	}
	since := read(func() ([]int64, error) {
		evs, err := s.ListEventsSince(ctx, store.EventFilter{}, before, 10)
		var ids []int64
		for _, e := range evs {
			ids = append(ids, e.ID)
		}
		return ids, err
	})
	latest := read(func() ([]int64, error) {
		id, err := s.LatestEventID(ctx)
		return []int64{id}, err
	})

	// Both must be waiting on the writers' lock, not answering.
	waitForLockWaiters(t, ctx, dsn, 2, since, latest)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := <-since
	if got.err != nil {
		t.Fatal(got.err)
	}
	if len(got.ids) != 2 || got.ids[0] != late || got.ids[1] != later.ID {
		t.Fatalf("ListEventsSince(%d) = %v, want [%d %d]", before, got.ids, late, later.ID)
	}
	if l := <-latest; l.err != nil || l.ids[0] != later.ID {
		t.Fatalf("LatestEventID = %v, %v; want %d", l.ids, l.err, later.ID)
	}
}

type readResult struct {
	ids []int64
	err error
}

// waitForLockWaiters returns once n sessions wait on an advisory lock, and
// fails if any of the reads answers first.
func waitForLockWaiters(t *testing.T, ctx context.Context, dsn string, n int, reads ...<-chan readResult) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, r := range reads {
			select {
			case got := <-r:
				t.Fatalf("a read answered %v (err %v) while an event below it was still in flight", got.ids, got.err)
			default:
			}
		}
		var waiting int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting >= n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d sessions wait on the events lock, want %d", waiting, n)
		case <-tick.C:
		}
	}
}

// An append's lock, INSERT and notification are one statement, and the
// lock still comes first: while the lock is held exclusively (as
// EventHorizon holds it), an append waits without drawing an id, and once
// it is released the append's notification names the id it drew.
func TestEventAppendTakesTheLockBeforeItDrawsAnID(t *testing.T) {
	dsn := pg.DSN(t)
	s := open(t, dsn, postgres.Options{})
	ctx := ctxT(t, 30*time.Second)
	first := event("first", "")
	if err := s.AppendEvent(ctx, first); err != nil {
		t.Fatal(err)
	}
	notes, stop := s.Subscribe(store.ChannelEvents)
	defer stop()

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	horizon, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = horizon.Rollback(context.Background()) }()
	if _, err := horizon.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, postgres.EventsLockKey); err != nil {
		t.Fatal(err)
	}

	waiting := event("waiting", "")
	appended := make(chan readResult, 1)
	go func() { appended <- readResult{err: s.AppendEvent(ctx, waiting)} }()
	waitForLockWaiters(t, ctx, dsn, 1, appended)
	var drawn int64
	if err := horizon.QueryRow(ctx, `SELECT pg_sequence_last_value('events_id_seq')`).Scan(&drawn); err != nil {
		t.Fatal(err)
	}
	if drawn != first.ID {
		t.Fatalf("an append waiting for the events lock already drew id %d (the last one before was %d)", drawn, first.ID)
	}
	if err := horizon.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-appended; r.err != nil {
		t.Fatal(r.err)
	}
	if waiting.ID <= first.ID {
		t.Fatalf("the append drew id %d, not above %d", waiting.ID, first.ID)
	}
	for want := strconv.FormatInt(waiting.ID, 10); ; {
		select {
		case got := <-notes:
			if got == want {
				return
			}
		case <-ctx.Done():
			t.Fatalf("no notification naming id %s", want)
		}
	}
}
