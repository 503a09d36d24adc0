// Package postgres is the store for several control plane replicas sharing
// one PostgreSQL database. Queries are sqlstore's, over pgx's
// database/sql driver; pgx is used natively only where database/sql
// cannot help: LISTEN/NOTIFY for cross-replica notifications and
// session-level advisory locks for leader election.
package postgres

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlstore"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Options tune Open. Zero values are the defaults.
type Options struct {
	Log *slog.Logger
	// WaitFor bounds how long Open waits for an unreachable server
	// (default 60 s; negative: do not wait).
	WaitFor time.Duration
	// MaxConns sizes the connection pool when the DSN does not
	// (pool_max_conns); default 32. The listener and each held election
	// lock use one more connection apiece.
	MaxConns int32
	// CampaignPoll is how often a campaigning replica tries the lock of a
	// loop it does not lead (default 1 s): with a dead leader, takeover
	// happens within about this long once its session is gone.
	CampaignPoll time.Duration
	// LockPing is how often a leader checks its lock connection (default
	// 1 s); a failed check ends the leadership context.
	LockPing time.Duration
	// ListenerPing is how long the listener waits for a notification
	// before checking its connection (default 15 s).
	ListenerPing time.Duration
}

func (o *Options) defaults() {
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.WaitFor == 0 {
		o.WaitFor = 60 * time.Second
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 32
	}
	if o.CampaignPoll <= 0 {
		o.CampaignPoll = time.Second
	}
	if o.LockPing <= 0 {
		o.LockPing = time.Second
	}
	if o.ListenerPing <= 0 {
		o.ListenerPing = 15 * time.Second
	}
}

// Store is the PostgreSQL backend.
type Store struct {
	*sqlstore.DB
	pool     *pgxpool.Pool
	listener *listener
	elector  *elector
	// lastReset is when connLost last emptied the pool (unix nanos).
	lastReset atomic.Int64
}

// Open connects to dsn (a postgres:// URL or key=value string), waiting
// for the server as Options.WaitFor allows, applies the migrations under
// an advisory lock (replicas may start together) and starts the listener.
func Open(ctx context.Context, dsn string, o Options) (*Store, error) {
	o.defaults()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// pgconn masks the password in its parse errors.
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if raw, err := pgconn.ParseConfig(dsn); err == nil {
		if _, set := raw.RuntimeParams["pool_max_conns"]; !set {
			// pgxpool's default is max(4, CPUs), which queues a busy
			// replica's calls behind a handful of connections.
			cfg.MaxConns = o.MaxConns
		}
	}
	where := describe(cfg.ConnConfig)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres %s: %w", where, err)
	}
	if err := waitReady(ctx, pool, where, o); err != nil {
		pool.Close()
		return nil, err
	}
	db := stdlib.OpenDBFromPool(pool)
	if err := migrate(ctx, db); err != nil {
		db.Close()
		pool.Close()
		return nil, fmt.Errorf("postgres %s: %w", where, err)
	}
	hub := sqlstore.NewHub()
	l, err := startListener(ctx, cfg.ConnConfig, hub, o, where)
	if err != nil {
		db.Close()
		pool.Close()
		return nil, fmt.Errorf("postgres %s: %w", where, err)
	}
	s := &Store{
		pool:     pool,
		listener: l,
		elector:  newElector(cfg.ConnConfig, o),
	}
	s.DB = sqlstore.New(db, sqlstore.Options{Dialect: dialect{lost: s.connLost}, Notifier: notifier{l},
		OnRetry: func(attempt int, err error) {
			o.Log.Warn("retrying transaction", "attempt", attempt+1, "err", err)
		}})
	return s, nil
}

// connLost runs when a call failed for want of a connection. A server
// restart or failover kills every pooled connection at once, but the pool
// only finds out one call at a time (it pings only connections idle for
// over a second), so without this each stale connection would fail one
// more call after the server is back. Emptying the pool at the first sign
// makes the next calls dial afresh. At most once a second: during an
// outage every call fails.
func (s *Store) connLost() {
	now := time.Now().UnixNano()
	last := s.lastReset.Load()
	if now-last < int64(time.Second) || !s.lastReset.CompareAndSwap(last, now) {
		return
	}
	s.pool.Reset()
}

// describe names a server for logs and errors, without the password.
func describe(c *pgx.ConnConfig) string {
	return fmt.Sprintf("host=%s port=%d dbname=%s user=%s", c.Host, c.Port, c.Database, c.User)
}

// waitReady pings until the server answers, backing off exponentially, for
// up to o.WaitFor. Only "cannot reach it" errors are retried: a wrong
// password or a missing database fails at once.
func waitReady(ctx context.Context, pool *pgxpool.Pool, where string, o Options) error {
	start := time.Now()
	delay := 250 * time.Millisecond
	for {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := pool.Ping(pctx)
		cancel()
		if err == nil {
			if time.Since(start) > time.Second {
				o.Log.Info("PostgreSQL is reachable", "server", where, "waited", time.Since(start).Round(time.Millisecond).String())
			}
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("postgres %s: %w", where, ctx.Err())
		}
		if !isUnavailable(err) {
			return fmt.Errorf("postgres %s: %w", where, err)
		}
		if o.WaitFor < 0 || time.Since(start)+delay > o.WaitFor {
			return fmt.Errorf("postgres %s: not reachable after %s: %v: %w", where,
				time.Since(start).Round(time.Second), err, store.ErrUnavailable)
		}
		o.Log.Warn(fmt.Sprintf("waiting for PostgreSQL at %s: %v; retrying in %s", where, err, delay))
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("postgres %s: %w", where, ctx.Err())
		case <-t.C:
		}
		delay = min(delay*2, 8*time.Second)
	}
}

// migrate applies the numbered migrations. sqlstore.Migrate creates its
// bookkeeping table with CREATE TABLE IF NOT EXISTS, which is not safe
// against a concurrent twin in PostgreSQL (both can fail on the catalog's
// unique index), so the table is created here first under the same
// advisory lock the migrations take.
func migrate(ctx context.Context, db *sql.DB) error {
	lock := "SELECT pg_advisory_xact_lock(" + strconv.FormatInt(migrateLockKey, 10) + ")"
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrate: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, lock); err != nil {
		return fmt.Errorf("migrate: lock: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)`); err != nil {
		return fmt.Errorf("migrate: create schema_migrations: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migrate: commit: %w", err)
	}
	sub, err := fs.Sub(migrationFS, "migrations")
	if err != nil {
		return err
	}
	ms, err := sqlstore.LoadMigrations(sub)
	if err != nil {
		return err
	}
	return sqlstore.Migrate(ctx, db, dialect{}, ms, lock)
}

// Elector implements store.Store: advisory locks, one session per held
// lock, so leadership ends when the leader's process or connection does.
func (s *Store) Elector() store.Elector { return s.elector }

// Backend implements store.Store.
func (s *Store) Backend() string { return "postgres" }

// Pool is the underlying pgx pool (benchmarks, health checks).
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Close ends every leadership this store holds, stops the listener and
// closes the pool.
func (s *Store) Close() error {
	s.elector.close()
	s.listener.close()
	err := s.SQL().Close()
	s.pool.Close()
	return err
}

// notifier sends notifications with pg_notify in the caller's transaction,
// so PostgreSQL delivers them on commit and drops them on rollback. Local
// subscribers get them back through this store's own listener, like every
// other replica: one path, one order.
type notifier struct{ l *listener }

var _ sqlstore.StatementNotifier = notifier{}

func (notifier) Notify(ctx context.Context, ex sqlstore.Execer, channel, payload string) (func(), error) {
	_, err := ex.ExecContext(ctx, `SELECT pg_notify($1, $2)`, channel, payload)
	return nil, err
}

// NotifyCall implements sqlstore.StatementNotifier.
func (notifier) NotifyCall(channel, payload string) string {
	return "pg_notify(" + channel + ", " + payload + ")"
}

func (n notifier) Subscribe(channel string) (<-chan string, func()) { return n.l.subscribe(channel) }

// lockKey maps a name into the 64-bit advisory lock space.
func lockKey(name string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return int64(h.Sum64())
}

// errClosed is returned by a campaign on a closed store.
var errClosed = errors.New("postgres: store closed")
