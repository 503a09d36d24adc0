// Package sqlite is the embedded default store: one file, pure Go
// (modernc.org/sqlite), WAL journal, immediate transactions.
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"sync"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlstore"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Store is the SQLite backend.
type Store struct {
	*sqlstore.DB
	hub   *sqlstore.Hub
	local *store.LocalElector

	// Group commit: writers queue here and one committer runs everything
	// waiting in a single transaction (see Tx).
	mu         sync.Mutex
	queue      []*txRequest
	committing bool
	// queued, when set (tests), hears of every transaction that joins
	// the queue.
	queued func()
}

type txRequest struct {
	ctx  context.Context
	fn   func(store.Queries) error
	done chan sqlstore.BatchResult
}

// maxBatch bounds one group commit, so a burst does not build one huge
// transaction that holds the write lock for long.
const maxBatch = 128

// Open opens (creating if needed) the database at path and applies the
// migrations.
func Open(ctx context.Context, path string) (*Store, error) {
	// WAL lets readers run beside the writer; FULL sync makes every commit
	// durable (an issued certificate must survive a power cut);
	// _txlock=immediate takes the write lock at BEGIN, so a read-then-write
	// transaction cannot deadlock against another one upgrading its lock.
	// temp_store=MEMORY keeps each savepoint's statement journal in memory:
	// group commit (Tx) runs every writer in its own savepoint, and on a
	// file the journal cost a write(2) per page and per 4-byte page number,
	// a quarter of an enrollment's CPU. Durability does not rest on it: a
	// crash discards an uncommitted transaction's WAL frames either way.
	q := url.Values{}
	for _, p := range []string{"journal_mode(WAL)", "synchronous(FULL)", "busy_timeout(10000)", "foreign_keys(1)", "temp_store(MEMORY)"} {
		q.Add("_pragma", p)
	}
	q.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	// Readers do not block each other under WAL; a handful of connections
	// is plenty, and writes are serialised in process by the writer mutex.
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(8)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	sub, _ := fs.Sub(migrationFS, "migrations")
	ms, err := sqlstore.LoadMigrations(sub)
	if err != nil {
		db.Close()
		return nil, err
	}
	if err := sqlstore.Migrate(ctx, db, dialect{}, ms, ""); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlite %s: %w", path, err)
	}
	s := &Store{hub: sqlstore.NewHub(), local: store.NewLocalElector()}
	s.DB = sqlstore.New(db, sqlstore.Options{Dialect: dialect{}, Notifier: notifier{s.hub}})
	return s, nil
}

// Tx implements store.Store with group commit. SQLite has one writer and
// every commit waits for an fsync (synchronous=FULL), so instead of each
// writer taking the lock and syncing in turn, writers queue in Go (not in
// SQLite's busy handler, which sleeps in coarse steps) and one committer
// runs all that are waiting in one transaction, each inside its own
// savepoint: a failing one is rolled back alone, the rest share one
// fsync. A lone writer commits at once; batches form only under load.
func (s *Store) Tx(ctx context.Context, fn func(store.Queries) error) error {
	req := &txRequest{ctx: ctx, fn: fn, done: make(chan sqlstore.BatchResult, 1)}
	s.mu.Lock()
	s.queue = append(s.queue, req)
	if s.queued != nil {
		s.queued()
	}
	if !s.committing {
		s.committing = true
		go s.commitLoop()
	}
	s.mu.Unlock()
	// Always wait for the outcome, even if ctx ends: once the function has
	// run, returning early could report a failure for work that committed.
	r := <-req.done
	if r.Err == nil {
		for _, f := range r.AfterCommit {
			f()
		}
	}
	return r.Err
}

func (s *Store) commitLoop() {
	for {
		s.mu.Lock()
		n := min(len(s.queue), maxBatch)
		if n == 0 {
			s.committing = false
			s.mu.Unlock()
			return
		}
		batch := s.queue[:n:n]
		s.queue = s.queue[n:]
		s.mu.Unlock()
		s.commit(batch)
	}
}

func (s *Store) commit(batch []*txRequest) {
	fns := make([]func(store.Queries) error, len(batch))
	for i, req := range batch {
		req := req
		fns[i] = func(q store.Queries) (err error) {
			// A caller that gave up before its turn gets its context's error
			// and nothing of its work is done.
			if err := req.ctx.Err(); err != nil {
				return err
			}
			// A panic is that caller's failure, not the committer's: the
			// others in the batch must still get their answers.
			defer func() {
				if p := recover(); p != nil {
					err = fmt.Errorf("transaction panicked: %v", p)
				}
			}()
			return req.fn(q)
		}
	}
	// The batch outlives any one caller's context: its commit carries the
	// others' work too.
	results, err := s.RunBatch(context.Background(), fns)
	for i, req := range batch {
		if err != nil {
			req.done <- sqlstore.BatchResult{Err: err}
			continue
		}
		req.done <- results[i]
	}
}

// The presence writes join the group commit queue instead of writing
// straight to the database. While agents connect by the thousand the
// committer holds SQLite's write lock batch after batch, and a writer
// outside the queue waits in SQLite's busy handler, which polls in coarse
// steps: 22 of 19,000 connecting agents' presences gave up after its
// 10 s (SQLITE_BUSY), and their pool members were unclaimable until they
// reconnected. In the queue they wait their turn in Go and share a
// commit.

// OpenPresence implements store.PresenceQueries through the queue.
func (s *Store) OpenPresence(ctx context.Context, p *store.Presence) error {
	return s.Tx(ctx, func(q store.Queries) error { return q.OpenPresence(ctx, p) })
}

// ClosePresence implements store.PresenceQueries through the queue.
func (s *Store) ClosePresence(ctx context.Context, instanceID store.InstanceID, streamID string, at time.Time) (closed bool, err error) {
	err = s.Tx(ctx, func(q store.Queries) error {
		closed, err = q.ClosePresence(ctx, instanceID, streamID, at)
		return err
	})
	return closed, err
}

// RenewPresence implements store.PresenceQueries through the queue.
func (s *Store) RenewPresence(ctx context.Context, replica string, until time.Time) (n int64, err error) {
	err = s.Tx(ctx, func(q store.Queries) error {
		n, err = q.RenewPresence(ctx, replica, until)
		return err
	})
	return n, err
}

// ExpirePresence implements store.PresenceQueries through the queue.
func (s *Store) ExpirePresence(ctx context.Context, replica string, at time.Time) (n int64, err error) {
	err = s.Tx(ctx, func(q store.Queries) error {
		n, err = q.ExpirePresence(ctx, replica, at)
		return err
	})
	return n, err
}

// Elector implements store.Store: one process owns the file, so every
// loop runs here.
func (s *Store) Elector() store.Elector { return s.local }

// Backend implements store.Store.
func (s *Store) Backend() string { return "sqlite" }

// Close implements store.Store.
func (s *Store) Close() error { return s.SQL().Close() }

type notifier struct{ hub *sqlstore.Hub }

func (n notifier) Notify(_ context.Context, _ sqlstore.Execer, channel, payload string) (func(), error) {
	return func() { n.hub.Publish(channel, payload) }, nil
}

func (n notifier) Subscribe(channel string) (<-chan string, func()) { return n.hub.Subscribe(channel) }

type dialect struct{}

func (dialect) Name() string           { return "sqlite" }
func (dialect) Rebind(q string) string { return q }
func (dialect) LockRow() string        { return "" }
func (dialect) SkipLocked() string     { return "" }

func code(err error) int {
	var se *sqlite.Error
	if errors.As(err, &se) {
		return se.Code()
	}
	return 0
}

func (dialect) IsUniqueViolation(err error) bool {
	c := code(err)
	return c == sqlite3.SQLITE_CONSTRAINT_UNIQUE || c == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY
}

func (dialect) IsForeignKeyViolation(err error) bool {
	return code(err) == sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY
}

func (dialect) IsUnavailable(err error) bool {
	c := code(err) & 0xff
	return c == sqlite3.SQLITE_BUSY || c == sqlite3.SQLITE_LOCKED || c == sqlite3.SQLITE_IOERR || c == sqlite3.SQLITE_FULL
}
