package postgres_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/postgres"
	"github.com/tetherfleet/tether/controlplane/store/storetest"
	"github.com/tetherfleet/tether/internal/testkit/pgtest"
)

// pg is the server this test binary's tests share (fsync off, for speed);
// every test gets a fresh database on it. pgDurable, started only by the
// benchmarks, keeps fsync on, as SQLite's synchronous=FULL does.
var (
	pg        pgtest.Shared
	pgDurable = pgtest.Shared{Options: pgtest.Options{Durable: true}}
)

func TestMain(m *testing.M) {
	code := m.Run()
	pg.Close()
	pgDurable.Close()
	os.Exit(code)
}

// fastOpts shortens the election timings so takeover tests run in seconds.
var fastOpts = postgres.Options{CampaignPoll: 100 * time.Millisecond, LockPing: 100 * time.Millisecond, ListenerPing: time.Second}

func open(t testing.TB, dsn string, o postgres.Options) *postgres.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := postgres.Open(ctx, dsn, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		s, err := postgres.Open(ctx, pg.DSN(t), postgres.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestReopenKeepsData(t *testing.T) {
	dsn := pg.DSN(t)
	ctx := context.Background()
	s := open(t, dsn, postgres.Options{})
	if err := s.CreateModule(ctx, &store.Module{Name: "m", Version: "1", Digest: "sha256:x"}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s2 := open(t, dsn, postgres.Options{})
	if _, err := s2.GetModule(ctx, "m", "1"); err != nil {
		t.Fatalf("data lost across reopen (migrations must be idempotent): %v", err)
	}
}
