package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/internal/testkit/pgtest"
)

// TestRollingUpgrade is issue 31's rolling upgrade on PostgreSQL, with the
// build before HEAD's newest migration checked out from this repository's
// own history into a git worktree:
//   - that build's store conformance suite runs against databases that
//     HEAD's migrations have been applied to (expand and contract: a
//     migration never breaks the queries of the build before it);
//   - that build and HEAD serve one database side by side for a minute
//     under the chaos load, the old one started first and the new one
//     migrating past it, with no unexpected call error and no error in
//     either log.
//
// It runs under `make rolling` (TETHER_ROLLING=1), which builds HEAD's
// tetherd and tether-bench first.
func TestRollingUpgrade(t *testing.T) {
	skip := func(format string, args ...any) {
		msg := "SKIP (rolling upgrade): " + fmt.Sprintf(format, args...)
		fmt.Fprintln(os.Stderr, msg)
		t.Skip(msg)
	}
	if os.Getenv("TETHER_ROLLING") == "" {
		skip("runs under `make rolling` (TETHER_ROLLING=1), which builds bin/tetherd and bin/tether-bench first")
	}
	if _, err := pgtest.FindBin(); err != nil {
		skip("no PostgreSQL server binaries: %v", err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"tetherd", "tether-bench"} {
		if _, err := os.Stat(filepath.Join(root, "bin", b)); err != nil {
			skip("bin/%s is missing; run `make rolling`", b)
		}
	}
	git := func(args ...string) (string, error) {
		out, err := exec.Command("git", append([]string{"-C", root}, args...)...).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	migrations := filepath.Join(root, "controlplane", "store", "postgres", "migrations")
	newest := newestMigration(t, migrations)
	added, err := git("log", "-n1", "--format=%H", "--diff-filter=A", "--", filepath.Join(migrations, newest))
	if err != nil || added == "" {
		skip("no git history for %s (not a git checkout?): %v %s", newest, err, added)
	}
	old := added + "^"
	if _, err := git("cat-file", "-e", old+"^{commit}"); err != nil {
		skip("the commit before %s (which added %s) is not in this clone (a shallow clone?)", added[:12], newest)
	}
	dir := filepath.Join(t.TempDir(), "old")
	if out, err := git("worktree", "add", "--detach", dir, old); err != nil {
		t.Fatalf("git worktree add %s: %v\n%s", old, err, out)
	}
	t.Cleanup(func() {
		if out, err := git("worktree", "remove", "--force", dir); err != nil {
			t.Errorf("git worktree remove: %v\n%s", err, out)
		}
	})
	t.Logf("the previous build: %s (before %s added %s)", old, added[:12], newest)

	t.Run("previous conformance suite on HEAD's schema", func(t *testing.T) {
		pkg := filepath.Join(dir, "controlplane", "store", "postgres")
		if err := os.WriteFile(filepath.Join(pkg, "zz_head_schema_test.go"), []byte(headSchemaTest), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("go", "test", "-count=1", "-run", "^TestPreviousBuildOnHeadSchema$", "./controlplane/store/postgres/")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "TETHER_HEAD_MIGRATIONS="+migrations)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("the previous build's conformance suite on HEAD's schema: %v\n%s", err, tail(string(out), 12000))
		}
		if !bytes.Contains(out, []byte("ok")) {
			t.Fatalf("the suite ran nothing:\n%s", out)
		}
	})

	t.Run("old and new replicas under load", func(t *testing.T) {
		oldBin := filepath.Join(t.TempDir(), "tetherd-old")
		build := exec.Command("go", "build", "-o", oldBin, "./cmd/tetherd")
		build.Dir = dir
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("build the previous tetherd: %v\n%s", err, out)
		}
		work := t.TempDir()
		cmd := exec.Command(filepath.Join(root, "bin", "tether-bench"), "chaos", "--tetherd", filepath.Join(root, "bin", "tetherd"),
			"--old-tetherd", oldBin, "--store", "postgres", "--duration", "1m", "--dir", work,
			// A lighter load than make chaos's: the point is the two
			// builds' queries meeting, and a call slowed past the
			// harness's 10 s by a busy machine counts against them.
			"--instances", "60", "--pools", "2", "--claimers", "8")
		out, err := cmd.CombinedOutput()
		t.Logf("%s", out)
		if err != nil {
			for _, l := range []string{"tetherd-0.log", "tetherd-1.log"} {
				b, _ := os.ReadFile(filepath.Join(work, l))
				t.Logf("%s (tail):\n%s", l, tail(string(b), 4000))
			}
			t.Fatalf("the old and the new build side by side: %v", err)
		}
	})
}

// newestMigration names the highest-numbered NNNN_name.sql in dir.
func newestMigration(t *testing.T, dir string) string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "[0-9][0-9][0-9][0-9]_*.sql"))
	if err != nil || len(names) == 0 {
		t.Fatalf("no migrations in %s: %v", dir, err)
	}
	sort.Strings(names)
	return filepath.Base(names[len(names)-1])
}

// headSchemaTest is put into the previous build's worktree beside its
// PostgreSQL tests: its own conformance suite, each test's fresh database
// opened (and migrated) by that build, then taken to HEAD's schema by
// HEAD's migration files, as a newer replica starting beside it would.
// It uses only what that build's tests already have (pg, storetest.Run).
const headSchemaTest = `package postgres_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/postgres"
	"github.com/tetherfleet/tether/controlplane/store/storetest"
)

func TestPreviousBuildOnHeadSchema(t *testing.T) {
	dir := os.Getenv("TETHER_HEAD_MIGRATIONS")
	if dir == "" {
		t.Skip("set by e2e's TestRollingUpgrade")
	}
	storetest.Run(t, func(t *testing.T) store.Store {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		dsn := pg.DSN(t)
		s, err := postgres.Open(ctx, dsn, postgres.Options{})
		if err != nil {
			t.Fatal(err)
		}
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var known int
		if err := db.QueryRowContext(ctx, "SELECT COALESCE(MAX(version), 0) FROM schema_migrations").Scan(&known); err != nil {
			t.Fatal(err)
		}
		files, err := filepath.Glob(filepath.Join(dir, "*.sql"))
		if err != nil {
			t.Fatal(err)
		}
		applied := 0
		for _, f := range files {
			name := filepath.Base(f)
			num, _, _ := strings.Cut(name, "_")
			v, err := strconv.Atoi(num)
			if err != nil || v <= known {
				continue
			}
			body, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, string(body)); err != nil {
				t.Fatalf("HEAD's migration %s: %v", name, err)
			}
			if _, err := db.ExecContext(ctx, "INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)", v, name, time.Now().UnixMicro()); err != nil {
				t.Fatal(err)
			}
			applied++
		}
		if applied == 0 {
			t.Fatalf("HEAD has no migration past this build's %d: nothing to test", known)
		}
		return s
	})
}
`
