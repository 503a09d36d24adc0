// Package pgtest gives tests a throwaway PostgreSQL server (pgserver),
// one shared by a whole test binary (see Shared); each test gets a fresh
// database on it, which is much faster than a cluster per test.
package pgtest

import "github.com/tetherfleet/tether/internal/tools/pgserver"

// The server itself lives in pgserver, which links no testing code; these
// names keep the tests' spelling.
type (
	Server  = pgserver.Server
	Options = pgserver.Options
)

// BinEnv names a directory holding initdb, pg_ctl and postgres.
const BinEnv = pgserver.BinEnv

// ErrNoBinaries means no PostgreSQL server binaries were found; tests skip
// on it (and only on it).
var ErrNoBinaries = pgserver.ErrNoBinaries

// NewServer starts a throwaway server (pgserver.NewServer).
func NewServer(opts Options) (*Server, error) { return pgserver.NewServer(opts) }

// FindBin returns the directory holding the server binaries.
func FindBin() (string, error) { return pgserver.FindBin() }
