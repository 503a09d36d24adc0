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
	hub    *sqlstore.Hub
	writer sync.Mutex
	local  *store.LocalElector
}

// Open opens (creating if needed) the database at path and applies the
// migrations.
func Open(ctx context.Context, path string) (*Store, error) {
	// WAL lets readers run beside the writer; FULL sync makes every commit
	// durable (an issued certificate must survive a power cut);
	// _txlock=immediate takes the write lock at BEGIN, so a read-then-write
	// transaction cannot deadlock against another one upgrading its lock.
	q := url.Values{}
	for _, p := range []string{"journal_mode(WAL)", "synchronous(FULL)", "busy_timeout(10000)", "foreign_keys(1)"} {
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
	s.DB = sqlstore.New(db, sqlstore.Options{
		Dialect:  dialect{},
		Notifier: notifier{s.hub},
		TxHook:   s.serialise,
	})
	return s, nil
}

// serialise queues writers in Go rather than letting them spin in SQLite's
// busy handler, which sleeps in coarse steps and wrecks tail latency.
func (s *Store) serialise(ctx context.Context, run func() error) error {
	s.writer.Lock()
	defer s.writer.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	return run()
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
