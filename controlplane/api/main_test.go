package api_test

import (
	"os"
	"testing"

	"github.com/tetherfleet/tether/internal/testkit/pgtest"
)

// pg is started only by a test that asks for PostgreSQL (bothStores).
var pg pgtest.Shared

func TestMain(m *testing.M) { os.Exit(pg.Run(m)) }

// bothStores runs fn against a control plane on SQLite and on PostgreSQL
// (skipped loudly without its binaries).
func bothStores(t *testing.T, fn func(t *testing.T, store testcpStore)) {
	t.Run("sqlite", func(t *testing.T) { fn(t, testcpStore{}) })
	t.Run("postgres", func(t *testing.T) { fn(t, testcpStore{dsn: pg.DSN(t)}) })
}

// testcpStore is the store option of a control plane started by a test.
type testcpStore struct{ dsn string }
