package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/bits"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/tetherfleet/tether/controlplane/store"
)

// Every batch size is cut into chunks that cover it exactly, each one of
// the ten prepared statement sizes, within the stated bound.
func TestHeartbeatChunkSizes(t *testing.T) {
	for n := 1; n <= 3*heartbeatChunk+1; n++ {
		statements, covered := 0, 0
		for left := n; left > 0; {
			c := heartbeatChunkSize(left)
			if c < 1 || c > left || c&(c-1) != 0 || c > heartbeatChunk {
				t.Fatalf("n=%d: chunk of %d with %d left", n, c, left)
			}
			left -= c
			covered += c
			statements++
		}
		if want := n/heartbeatChunk + bits.OnesCount(uint(n%heartbeatChunk)); covered != n || statements != want || statements > n/heartbeatChunk+9 {
			t.Fatalf("n=%d: %d statements covering %d, want %d covering %d", n, statements, covered, want, n)
		}
	}
}

// Each statement binds 8 parameters a row for its 2^k rows.
func TestHeartbeatUpdateTexts(t *testing.T) {
	for k, q := range heartbeatUpdates {
		if got, want := strings.Count(q, "?"), 8<<k; got != want {
			t.Fatalf("heartbeatUpdates[%d] has %d placeholders, want %d", k, got, want)
		}
	}
	if len(heartbeatUpdates) != bits.Len(heartbeatChunk) {
		t.Fatalf("%d statement sizes, but a chunk of %d needs %d", len(heartbeatUpdates), heartbeatChunk, bits.Len(heartbeatChunk))
	}
}

func TestNewestPerInstance(t *testing.T) {
	at := func(s int) time.Time { return time.Unix(int64(s), 0) }
	hb := func(id store.InstanceID, s int, phase string) store.Heartbeat {
		return store.Heartbeat{InstanceID: id, At: at(s), Phase: phase}
	}
	for _, tc := range []struct {
		name string
		in   []store.Heartbeat
		want []string // id/phase, in id order
	}{
		{"empty", nil, nil},
		{"sorted by id", []store.Heartbeat{hb("c", 1, "c"), hb("a", 1, "a"), hb("b", 1, "b")}, []string{"a/a", "b/b", "c/c"}},
		{"newest first", []store.Heartbeat{hb("a", 2, "new"), hb("a", 1, "old")}, []string{"a/new"}},
		{"newest last", []store.Heartbeat{hb("a", 1, "old"), hb("a", 2, "new")}, []string{"a/new"}},
		{"equal times: the later, as writing in order would", []store.Heartbeat{hb("a", 1, "first"), hb("a", 1, "second")}, []string{"a/second"}},
		{"interleaved", []store.Heartbeat{hb("b", 3, "b3"), hb("a", 1, "a1"), hb("b", 1, "b1"), hb("a", 5, "a5"), hb("b", 2, "b2")}, []string{"a/a5", "b/b3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			orig := append([]store.Heartbeat(nil), tc.in...)
			var got []string
			for _, h := range newestPerInstance(tc.in) {
				got = append(got, h.InstanceID.String()+"/"+h.Phase)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for i := range orig { // the caller's slice (the hub may requeue it) is left alone
				if tc.in[i].InstanceID != orig[i].InstanceID || tc.in[i].Phase != orig[i].Phase {
					t.Fatalf("input reordered: %v", tc.in)
				}
			}
		})
	}
}

// testDialect is just enough of a Dialect for a bare SQLite file.
type testDialect struct{}

func (testDialect) Name() string                     { return "sqlite" }
func (testDialect) Rebind(q string) string           { return q }
func (testDialect) LockRow() string                  { return "" }
func (testDialect) SkipLocked() string               { return "" }
func (testDialect) IsUniqueViolation(error) bool     { return false }
func (testDialect) IsForeignKeyViolation(error) bool { return false }
func (testDialect) IsUnavailable(error) bool         { return false }

func openTestDB(t *testing.T) *DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "t.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec(`CREATE TABLE kv (k TEXT PRIMARY KEY, v INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return New(db, Options{Dialect: testDialect{}})
}

// exec runs the same way in autocommit, in a transaction and on a pinned
// connection, and prepares a text once however many run it at once.
func TestExecPrepared(t *testing.T) {
	d := openTestDB(t)
	ctx := context.Background()
	const ins = `INSERT INTO kv (k, v) VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = kv.v + excluded.v`
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := d.exec(ctx, ins, "auto", 1)
			if err != nil {
				errs <- fmt.Errorf("goroutine %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	err := d.Tx(ctx, func(q store.Queries) error {
		for range 3 {
			if _, err := q.(*queries).exec(ctx, ins, "tx", 1); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("in a transaction: %v", err)
	}
	conn, err := d.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := (&queries{ex: conn, db: d}).exec(ctx, ins, "conn", 1); err != nil {
		t.Fatalf("on a connection: %v", err)
	}
	for k, want := range map[string]int{"auto": 16, "tx": 3, "conn": 1} {
		var v int
		if err := conn.QueryRowContext(ctx, `SELECT v FROM kv WHERE k = ?`, k).Scan(&v); err != nil || v != want {
			t.Fatalf("%s: v = %d (%v), want %d", k, v, err, want)
		}
	}
	n := 0
	d.prepared.Range(func(any, any) bool { n++; return true })
	if n != 1 {
		t.Fatalf("%d prepared statements cached for one text, want 1", n)
	}
}

// A statement that does not prepare is an error (from running its text
// unprepared), and is not cached: the next call tries again.
func TestExecPreparedBadStatement(t *testing.T) {
	d := openTestDB(t)
	ctx := context.Background()
	for range 2 {
		_, err := d.exec(ctx, `UPDATE no_such_table SET v = ?`, 1)
		if err == nil || !strings.Contains(err.Error(), "no_such_table") {
			t.Fatalf("err = %v, want an error naming the table", err)
		}
	}
	d.prepared.Range(func(k, _ any) bool { t.Fatalf("cached a statement that failed to prepare: %v", k); return false })
	// An error from running it (a constraint) comes back classified, not
	// swallowed.
	if _, err := d.db.Exec(`CREATE TABLE strict (v INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := d.exec(ctx, `INSERT INTO strict (v) VALUES (?)`, nil); err == nil || !strings.Contains(err.Error(), "NOT NULL") {
		t.Fatalf("err = %v, want the NOT NULL failure", err)
	}
}

// Where the driver caches statements itself, queries hold none.
func TestExecPreparedLeavesCachingDriversAlone(t *testing.T) {
	d := openTestDB(t)
	d.dialect = cachingDialect{}
	if _, err := d.exec(context.Background(), `INSERT INTO kv (k, v) VALUES (?, ?)`, "a", 1); err != nil {
		t.Fatal(err)
	}
	d.prepared.Range(func(k, _ any) bool { t.Fatalf("prepared %v though the driver caches statements", k); return false })
}

// Reads go through the prepared statements too: rows and single rows in
// autocommit and in a transaction, a statement run again before the last
// one's rows were read to the end, and a write after a read in one
// transaction (a statement left open would hold SQLite's read snapshot).
func TestQueriesThroughPreparedStatements(t *testing.T) {
	d := openTestDB(t)
	ctx := context.Background()
	for i, k := range []string{"a", "b", "c"} {
		if _, err := d.exec(ctx, `INSERT INTO kv (k, v) VALUES (?, ?)`, k, i+1); err != nil {
			t.Fatal(err)
		}
	}
	sum := func(q *queries) (int, error) {
		rows, err := q.query(ctx, `SELECT v FROM kv WHERE v > ? ORDER BY k`, 0)
		if err != nil {
			return 0, err
		}
		defer rows.Close()
		total := 0
		for rows.Next() {
			var v int
			if err := rows.Scan(&v); err != nil {
				return 0, err
			}
			total += v
		}
		return total, rows.Err()
	}
	one := func(q *queries, k string) (int, error) {
		var v int
		err := q.row(ctx, `SELECT v FROM kv WHERE k = ?`, k).Scan(&v)
		return v, err
	}
	for range 3 {
		if got, err := sum(d.queries); err != nil || got != 6 {
			t.Fatalf("sum = %d, %v; want 6", got, err)
		}
		if got, err := one(d.queries, "b"); err != nil || got != 2 {
			t.Fatalf("row b = %d, %v; want 2", got, err)
		}
	}
	if _, err := one(d.queries, "zz"); !errors.Is(err, sql.ErrNoRows) {
		t.Fatalf("missing row: err = %v, want sql.ErrNoRows", err)
	}
	err := d.Tx(ctx, func(sq store.Queries) error {
		q := sq.(*queries)
		// A first read left unfinished, then the same text again.
		open, err := q.query(ctx, `SELECT v FROM kv WHERE v > ? ORDER BY k`, 0)
		if err != nil {
			return err
		}
		if !open.Next() {
			return fmt.Errorf("no first row: %v", open.Err())
		}
		if got, err := sum(q); err != nil || got != 6 {
			return fmt.Errorf("sum in tx = %d, %v; want 6", got, err)
		}
		open.Close()
		if _, err := q.exec(ctx, `UPDATE kv SET v = v * 10 WHERE k = ?`, "a"); err != nil {
			return err
		}
		if got, err := one(q, "a"); err != nil || got != 10 {
			return fmt.Errorf("row a in tx = %d, %v; want 10", got, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := sum(d.queries); err != nil || got != 15 {
		t.Fatalf("sum after commit = %d, %v; want 15", got, err)
	}
}

// Past maxPrepared distinct texts a new one runs unprepared, and still
// runs.
func TestPreparedIsBounded(t *testing.T) {
	d := openTestDB(t)
	ctx := context.Background()
	for i := range maxPrepared + 10 {
		q := fmt.Sprintf(`SELECT %d FROM kv WHERE k = ?`, i)
		var v int
		if err := d.row(ctx, q, "none").Scan(&v); !errors.Is(err, sql.ErrNoRows) {
			t.Fatalf("query %d: err = %v, want sql.ErrNoRows", i, err)
		}
	}
	n := 0
	d.prepared.Range(func(any, any) bool { n++; return true })
	if n != maxPrepared || d.nprepared.Load() != maxPrepared {
		t.Fatalf("%d statements cached (counted %d), want %d", n, d.nprepared.Load(), maxPrepared)
	}
}

type cachingDialect struct{ testDialect }

func (cachingDialect) CachesStatements() bool { return true }

// queryAll reads through the prepared statement inside a transaction too,
// run after run, beside a write, and while query holds the same text's
// rows open (query runs that text unprepared, so the two never share a
// cursor).
func TestQueryAllPreparesInATransaction(t *testing.T) {
	d := openTestDB(t)
	ctx := context.Background()
	for i, k := range []string{"a", "b", "c"} {
		if _, err := d.exec(ctx, `INSERT INTO kv (k, v) VALUES (?, ?)`, k, i+1); err != nil {
			t.Fatal(err)
		}
	}
	const text = `SELECT v FROM kv WHERE v > ? ORDER BY k`
	scanInt := func(s scanner) (int, error) {
		var v int
		return v, s.Scan(&v)
	}
	err := d.Tx(ctx, func(sq store.Queries) error {
		q := sq.(*queries)
		open, err := q.query(ctx, text, 0)
		if err != nil {
			return err
		}
		defer open.Close()
		if !open.Next() {
			return fmt.Errorf("no first row: %v", open.Err())
		}
		for run, want := range [][]int{{1, 2, 3}, {10, 2, 3}} {
			got, err := queryAll(ctx, q, scanInt, text, 0)
			if err != nil || !slices.Equal(got, want) {
				return fmt.Errorf("run %d: %v, %v; want %v", run, got, err, want)
			}
			if _, err := q.exec(ctx, `UPDATE kv SET v = v * 10 WHERE k = ?`, "a"); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := d.prepared.Load(d.queries.sql(text)); !ok {
		t.Fatalf("queryAll did not prepare %q", text)
	}
}
