package pgtest_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tetherfleet/tether/internal/testkit/pgtest"
)

var pg pgtest.Shared

func TestMain(m *testing.M) { os.Exit(pg.Run(m)) }

func query(t *testing.T, dsn string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT 1 + 1").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestSharedGivesFreshDatabases(t *testing.T) {
	a, b := pg.DSN(t), pg.DSN(t)
	if a == b {
		t.Fatal("two tests got the same database")
	}
	if query(t, a) != 2 || query(t, b) != 2 {
		t.Fatal("query failed")
	}
}

func TestStopStartKeepsData(t *testing.T) {
	srv := pgtest.StartServer(t, pgtest.Options{})
	dsn := pgtest.NewDatabase(t, srv)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE kept (v int); INSERT INTO kept VALUES (7)"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := pgx.Connect(ctx, dsn); err == nil {
		t.Fatal("connected to a stopped server")
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	conn, err = pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var v int
	if err := conn.QueryRow(ctx, "SELECT v FROM kept").Scan(&v); err != nil || v != 7 {
		t.Fatalf("data across restart: %d, %v", v, err)
	}
}
