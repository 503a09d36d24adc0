// Package sqlstore is the one query layer both backends share, over
// database/sql. A backend supplies a Dialect (placeholders, row locks,
// error classification) and a Notifier; everything else is common, so the
// storetest suite exercises the same SQL on SQLite and PostgreSQL.
package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/clock"
)

// Dialect is what differs between backends.
type Dialect interface {
	Name() string
	// Rebind turns ? placeholders into the backend's form.
	Rebind(query string) string
	// LockRow is appended to a SELECT that must lock its row until the
	// transaction ends (" FOR UPDATE" on PostgreSQL; SQLite's immediate
	// transaction already holds the write lock).
	LockRow() string
	// SkipLocked is appended to a claim SELECT (" FOR UPDATE SKIP LOCKED").
	SkipLocked() string
	IsUniqueViolation(err error) bool
	IsForeignKeyViolation(err error) bool
	// IsUnavailable reports a lost or refused connection.
	IsUnavailable(err error) bool
}

// EventSerializer is an optional Dialect extension. Where transactions can
// commit in another order than the one their event ids were drawn in
// (PostgreSQL sequences), a reader following ids (events.Watch) could step
// over an event that commits late.
//
// SerializeEvents is a SELECT that each transaction's event INSERT runs
// first, as a CTE of its own statement (see flushEvents), and that holds
// until the transaction ends; writers must not exclude each other with it,
// or the fleet's event writes take turns at one commit at a time (what
// stopped six replicas short of 100,000 agents, docs/reliability.md).
// EventHorizon is a query, run as a statement of its own, for the highest
// id at or below which every drawn id belongs to a transaction that has
// ended: it waits for the writers that hold SerializeEvents. Readers that
// follow ids read only up to it.
//
// The writers' statement is taken at commit, after everything else the
// transaction does (see flushEvents): a writer holding it then waits on
// nothing but its own INSERT, so it cannot close a deadlock with a row
// lock taken after an append, nor with a reader waiting for the horizon.
type EventSerializer interface {
	SerializeEvents() string
	EventHorizon() string
}

// TxRetrier is an optional Dialect extension naming the errors after which
// a whole transaction may simply run again: PostgreSQL's deadlock victim
// (40P01) and serialization failure (40001) are the server's own advice to
// retry, not a fault of the request.
type TxRetrier interface {
	IsRetryable(err error) bool
}

// StatementCacher is an optional Dialect extension for a driver that
// keeps its own per-connection cache of prepared statements, keyed by
// query text (pgx does). queries then leave the statement to the
// driver instead of holding a database/sql one beside it, which measured
// no faster there and cost client CPU.
type StatementCacher interface {
	CachesStatements() bool
}

// maxTxAttempts bounds how often Tx runs one transaction that keeps losing
// to concurrent writers; a steady loop would be a bug.
const maxTxAttempts = 8

// retryBase and retryCap shape the pause before a re-run: a random wait
// in [0, retryBase·2^(attempt-1)], at most retryCap. Without it the victim
// re-ran at once, straight back into the writers it had just crossed, and
// under load the same transaction could lose five times in a row (CI saw
// it). The random spread lets the survivors finish first.
const (
	retryBase = 5 * time.Millisecond
	retryCap  = 250 * time.Millisecond
)

// retryDelay is the pause before attempt+1, given that attempt failed.
func retryDelay(attempt int) time.Duration {
	ceiling := min(retryBase<<(attempt-1), retryCap)
	return rand.N(ceiling + 1)
}

// Execer is satisfied by *sql.DB, *sql.Conn and *sql.Tx.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Notifier delivers store.Notify calls.
type Notifier interface {
	// Notify runs inside the caller's transaction (or autocommit) on ex. It
	// may return a function to run once the transaction has committed.
	Notify(ctx context.Context, ex Execer, channel, payload string) (afterCommit func(), err error)
	Subscribe(channel string) (<-chan string, func())
}

// StatementNotifier is an optional Notifier extension: its notification
// is a function a statement calls (PostgreSQL's pg_notify), sent at commit
// as Notify's is. The events flush then notifies in the INSERT's own
// round trip.
type StatementNotifier interface {
	// NotifyCall is the SQL call that notifies channel with payload, both
	// SQL expressions.
	NotifyCall(channel, payload string) string
}

// DB implements store.Store except Elector, Backend and Close, which the
// backend adds.
type DB struct {
	*queries
	db       *sql.DB
	dialect  Dialect
	notifier Notifier
	onRetry  func(attempt int, err error)
	clock    clock.Clock
	// stmts caches rebound query text.
	rebound sync.Map
	// prepared holds the statements stmt hands out, by query text, and
	// nprepared counts them.
	prepared  sync.Map
	nprepared atomic.Int64
	// observe, when set, is shown every statement's text as it runs
	// (ObserveStatements).
	observe atomic.Pointer[func(string)]
}

// ObserveStatements shows f the text of every statement this store runs
// from now until stop is called, as sent to the database: the plan tests
// explain the store's own SQL, not copies of it.
func (d *DB) ObserveStatements(f func(query string)) (stop func()) {
	d.observe.Store(&f)
	return func() { d.observe.Store(nil) }
}

func (q *queries) observed(query string) {
	if f := q.db.observe.Load(); f != nil {
		(*f)(q.sql(query))
	}
}

// Options configure New.
type Options struct {
	Dialect  Dialect
	Notifier Notifier
	// OnRetry, if set, hears about every transaction Tx runs again (for a
	// log line: a steady stream of them is contention worth a look).
	OnRetry func(attempt int, err error)
	// Clock times the pause between re-runs; the real clock if nil.
	Clock clock.Clock
}

// New wraps an open database.
func New(db *sql.DB, o Options) *DB {
	d := &DB{db: db, dialect: o.Dialect, notifier: o.Notifier, onRetry: o.OnRetry, clock: o.Clock}
	if d.clock == nil {
		d.clock = clock.Real{}
	}
	d.queries = &queries{ex: db, db: d}
	return d
}

// SQL returns the underlying pool (for migrations and health checks).
func (d *DB) SQL() *sql.DB { return d.db }

// Subscribe implements store.Store.
func (d *DB) Subscribe(channel string) (<-chan string, func()) {
	return d.notifier.Subscribe(channel)
}

// Tx implements store.Store. A transaction the dialect reports as safe to
// re-run (a deadlock victim, a serialization failure) is rolled back and,
// after a short random pause, run again, up to maxTxAttempts times, so that a write the caller was told
// succeeded is never one PostgreSQL threw away, and contention alone never
// reaches a client as Internal. fn must therefore be safe to call again:
// it starts from what it reads through q, not from effects of an earlier
// attempt.
func (d *DB) Tx(ctx context.Context, fn func(q store.Queries) error) error {
	r, ok := d.dialect.(TxRetrier)
	for attempt := 1; ; attempt++ {
		err := d.tx(ctx, fn)
		if err == nil || !ok || !r.IsRetryable(err) || ctx.Err() != nil {
			return err
		}
		if attempt == maxTxAttempts {
			return fmt.Errorf("transaction lost to concurrent writers %d times, giving up: %w: %w", attempt, err, store.ErrUnavailable)
		}
		if d.onRetry != nil {
			d.onRetry(attempt, err)
		}
		select {
		case <-d.clock.After(retryDelay(attempt)):
		case <-ctx.Done():
			return fmt.Errorf("%w (gave up waiting to retry: %w)", err, ctx.Err())
		}
	}
}

// tx is one attempt of Tx.
func (d *DB) tx(ctx context.Context, fn func(q store.Queries) error) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return d.classify(fmt.Errorf("begin transaction: %w", err))
	}
	q := &queries{ex: tx, db: d, inTx: true}
	if err := fn(q); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := q.flushEvents(ctx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return d.classify(commitErr(ctx, err))
	}
	for _, f := range q.afterCommit {
		f()
	}
	return nil
}

// commitErr names why a commit failed. When the caller's context ended
// during the transaction, database/sql has already rolled it back and
// Commit says only ErrTxDone: the cause is the context (a client that gave
// up), which callers map to Canceled or DeadlineExceeded, not an internal
// error.
func commitErr(ctx context.Context, err error) error {
	if errors.Is(err, sql.ErrTxDone) && ctx.Err() != nil {
		return fmt.Errorf("commit: rolled back: %w", ctx.Err())
	}
	return fmt.Errorf("commit: %w", err)
}

// queries implements store.Queries on an Execer.
type queries struct {
	ex   Execer
	db   *DB
	inTx bool
	// shared marks queries run inside a group commit's transaction
	// (RunBatch), which carries other callers' work too. Their statements
	// do not stop when the caller's context ends: SQLite answers an
	// interrupted INSERT, UPDATE or DELETE inside a transaction by rolling
	// the whole transaction back, every other caller's savepoint with it,
	// so one client that dropped its call failed the batch ("no such
	// savepoint: tether_batch", answered Internal to the rest). The
	// caller's function still sees its own context and may return its
	// error, which rolls back its savepoint alone.
	shared      bool
	afterCommit []func()
	// pending holds a transaction's events until commit where the dialect
	// serialises event writers (see flushEvents).
	pending []*store.Event
}

func (q *queries) sql(query string) string {
	if v, ok := q.db.rebound.Load(query); ok {
		return v.(string)
	}
	r := q.db.dialect.Rebind(query)
	q.db.rebound.Store(query, r)
	return r
}

// stmtCtx is the context a statement runs under (see shared).
func (q *queries) stmtCtx(ctx context.Context) context.Context {
	if q.shared {
		return context.WithoutCancel(ctx)
	}
	return ctx
}

func (q *queries) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	q.observed(query)
	ctx = q.stmtCtx(ctx)
	var res sql.Result
	var err error
	if st := q.stmt(ctx, query); st != nil {
		res, err = st.ExecContext(ctx, args...)
	} else {
		res, err = q.ex.ExecContext(ctx, q.sql(query), args...)
	}
	return res, q.db.classify(err)
}

func (q *queries) query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	// In a transaction every statement runs on one connection, where one
	// prepared statement cannot serve a second query while the first's
	// rows are still open (SQLite: "API misuse"); a text prepared per call
	// can. Outside one, an open result holds its connection, so the next
	// call runs on another.
	return q.rows(ctx, !q.inTx, query, args...)
}

// rows runs query through its prepared statement when prepared allows
// and there is one, else as text.
func (q *queries) rows(ctx context.Context, prepared bool, query string, args ...any) (*sql.Rows, error) {
	q.observed(query)
	ctx = q.stmtCtx(ctx)
	var st *sql.Stmt
	if prepared {
		st = q.stmt(ctx, query)
	}
	var rows *sql.Rows
	var err error
	if st != nil {
		rows, err = st.QueryContext(ctx, args...)
	} else {
		rows, err = q.ex.QueryContext(ctx, q.sql(query), args...)
	}
	return rows, q.db.classify(err)
}

// queryAll runs query and reads all its rows with scan. The rows are
// closed before it returns and scan runs no query, so no second cursor can
// open on the statement meanwhile: unlike query, it can use the prepared
// statement inside a transaction too. On SQLite that spares parsing the
// text again on every call (a claim's locked read of its members was a
// sixth of the claim benchmark's CPU in the parser).
func queryAll[T any](ctx context.Context, q *queries, scan func(scanner) (T, error), query string, args ...any) ([]T, error) {
	rows, err := q.rows(ctx, true, query, args...)
	if err != nil {
		return nil, err
	}
	return collect(q, rows, scan)
}

func (q *queries) row(ctx context.Context, query string, args ...any) *sql.Row {
	q.observed(query)
	ctx = q.stmtCtx(ctx)
	if st := q.stmt(ctx, query); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return q.ex.QueryRowContext(ctx, q.sql(query), args...)
}

// maxPrepared bounds the statements kept prepared. The texts are the
// store's own, but a few are built per call (an IN list as long as a
// filter), so a text past the bound runs unprepared rather than grow the
// cache without end.
const maxPrepared = 512

// stmt returns the prepared statement to run query through, bound to q's
// transaction when there is one, or nil to run the text directly: where
// the driver keeps its own statement cache (pgx), on a *sql.Conn (which
// cannot borrow a pool's statement), past maxPrepared, or when preparing
// failed (running the text then reports the error in its place).
//
// Preparing once per connection matters on SQLite: modernc parses every
// call's text again, and at fleet scale and under enrollment load that
// was a tenth of tetherd's CPU (the heartbeat UPDATE: a third of its
// write). database/sql keeps the statement prepared on every connection
// it has run on, and a transaction borrows it for its own connection;
// the transaction's copy is closed with the transaction.
func (q *queries) stmt(ctx context.Context, query string) *sql.Stmt {
	if c, ok := q.db.dialect.(StatementCacher); ok && c.CachesStatements() {
		return nil
	}
	switch ex := q.ex.(type) {
	case *sql.Tx:
		st := q.db.prepare(ctx, q.sql(query))
		if st == nil {
			return nil
		}
		return ex.StmtContext(ctx, st)
	case *sql.DB:
		return q.db.prepare(ctx, q.sql(query))
	default:
		return nil
	}
}

// prepare returns the pool-wide statement for the (rebound) query,
// preparing it on first use, or nil past maxPrepared or on an error. Two
// callers racing on first use may both prepare; the loser closes its
// copy.
func (d *DB) prepare(ctx context.Context, query string) *sql.Stmt {
	if v, ok := d.prepared.Load(query); ok {
		return v.(*sql.Stmt)
	}
	if d.nprepared.Load() >= maxPrepared {
		return nil
	}
	st, err := d.db.PrepareContext(ctx, query)
	if err != nil {
		return nil
	}
	if v, loaded := d.prepared.LoadOrStore(query, st); loaded {
		_ = st.Close() // an unused duplicate; nothing ran on it
		return v.(*sql.Stmt)
	}
	d.nprepared.Add(1)
	return st
}

// Notify implements store.Queries.
func (q *queries) Notify(ctx context.Context, channel, payload string) error {
	after, err := q.db.notifier.Notify(ctx, q.ex, channel, payload)
	if err != nil {
		return q.db.classify(fmt.Errorf("notify %s: %w", channel, err))
	}
	if after != nil {
		if q.inTx {
			q.afterCommit = append(q.afterCommit, after)
		} else {
			after()
		}
	}
	return nil
}

// classify maps driver errors onto the store sentinels.
func (d *DB) classify(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrAlreadyExists) ||
		errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrUnavailable) {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	dl := d.dialect
	switch {
	case dl.IsUniqueViolation(err):
		return fmt.Errorf("%v: %w", err, store.ErrAlreadyExists)
	case dl.IsForeignKeyViolation(err):
		return fmt.Errorf("%v: %w", err, store.ErrConflict)
	case dl.IsUnavailable(err):
		return fmt.Errorf("%v: %w", err, store.ErrUnavailable)
	}
	return err
}

// notFound turns sql.ErrNoRows into store.ErrNotFound.
func notFound(err error, what string, key any) error {
	if errors.Is(err, sql.ErrNoRows) {
		return store.Errorf(store.ErrNotFound, "%s %q", what, key)
	}
	return err
}

// in renders "IN (?,?,?)" for n values.
func in(n int) string {
	return "IN (" + strings.TrimSuffix(strings.Repeat("?,", n), ",") + ")"
}

func anySlice[S ~string](ss []S) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = string(s)
	}
	return out
}
