package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"
)

// skip skips t loudly: the reason goes to stderr too, so that a skipped
// PostgreSQL suite is visible without -v.
func skip(t testing.TB, err error) {
	t.Helper()
	msg := fmt.Sprintf("SKIPPING PostgreSQL test %s: %v", t.Name(), err)
	fmt.Fprintln(os.Stderr, msg)
	t.Skip(msg)
}

// Shared is one server for a whole test binary, started on first use.
// Declare it in the test package and stop it from TestMain:
//
//	var pg pgtest.Shared
//	func TestMain(m *testing.M) { os.Exit(pg.Run(m)) }
type Shared struct {
	Options Options

	once sync.Once
	srv  *Server
	err  error
}

// Run runs the tests, then stops the server if one was started.
func (sh *Shared) Run(m *testing.M) int {
	code := m.Run()
	sh.Close()
	return code
}

// Close stops the server if one was started (for a TestMain that shares
// more than one).
func (sh *Shared) Close() {
	if sh.srv != nil {
		if err := sh.srv.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
		}
	}
}

// Server returns the shared server, starting it on first use. It skips t
// when the binaries are absent and fails it on any other error.
func (sh *Shared) Server(t testing.TB) *Server {
	t.Helper()
	sh.once.Do(func() { sh.srv, sh.err = NewServer(sh.Options) })
	if errors.Is(sh.err, ErrNoBinaries) {
		skip(t, sh.err)
	}
	if sh.err != nil {
		t.Fatal(sh.err)
	}
	return sh.srv
}

// DSN creates a fresh database on the shared server for t and drops it
// when t ends.
func (sh *Shared) DSN(t testing.TB) string {
	t.Helper()
	return NewDatabase(t, sh.Server(t))
}

// NewDatabase creates a fresh database on srv, dropped when t ends.
func NewDatabase(t testing.TB, srv *Server) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name, dsn, err := srv.CreateDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := srv.DropDatabase(ctx, name); err != nil {
			t.Logf("pgtest: %v", err)
		}
	})
	return dsn
}

// StartServer starts a server of t's own (for tests that stop or restart
// it), closed when t ends. It skips t when the binaries are absent.
func StartServer(t testing.TB, opts Options) *Server {
	t.Helper()
	srv, err := NewServer(opts)
	if errors.Is(err, ErrNoBinaries) {
		skip(t, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	return srv
}
