package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"

	"github.com/tetherfleet/tether/controlplane/store/sqlstore"
)

// Snapshot writes a consistent copy of the database at path to dst with
// VACUUM INTO, on a connection of its own: a tetherd serving the database
// goes on reading and writing while the copy is made (VACUUM INTO reads
// in one read transaction, which WAL lets run beside the writer). dst
// must not exist. The copy is a compacted database with no WAL, ready to
// open. A file copy of a live WAL database is not a backup: it may take
// the main file and the WAL at different moments.
func Snapshot(ctx context.Context, path, dst string) error {
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("snapshot %s: %w", path, err)
	}
	if _, err := os.Stat(dst); !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("snapshot: %s already exists", dst)
	}
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(10000)")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return fmt.Errorf("snapshot %s: %w", path, err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `VACUUM INTO ?`, dst); err != nil {
		return fmt.Errorf("snapshot %s: %w", path, err)
	}
	if err := os.Chmod(dst, 0o600); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	return nil
}

// SchemaVersion is the newest migration this build applies.
func SchemaVersion() int {
	sub, _ := fs.Sub(migrationFS, "migrations")
	ms, err := sqlstore.LoadMigrations(sub)
	if err != nil || len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Version
}

// DatabaseSchema reads the newest migration recorded in the database at
// path, without migrating it.
func DatabaseSchema(ctx context.Context, path string) (int, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		return 0, fmt.Errorf("open %s: %w", path, err)
	}
	defer db.Close()
	var v sql.NullInt64
	if err := db.QueryRowContext(ctx, `SELECT MAX(version) FROM schema_migrations`).Scan(&v); err != nil {
		return 0, fmt.Errorf("read the schema of %s: %w", path, err)
	}
	return int(v.Int64), nil
}
