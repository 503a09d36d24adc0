package daemon

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
)

// A data dir made loose beforehand (`mkdir -m755 D`) is tightened to 0700
// by init, and the database and its journals are 0600 whatever the umask:
// they hold every token hash, certificate and sealed credential.
func TestDataDirIsPrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "d")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil { // whatever the umask
		t.Fatal(err)
	}
	if err := Init(InitOptions{DataDir: dir}); err != nil {
		t.Fatal(err)
	}
	wantMode(t, dir, 0o700)
	// A data dir loosened after init is tightened again when serve opens
	// its database.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := OpenStore(ctx, "sqlite", dir, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// A write makes the WAL and shared-memory files.
	if err := st.Tx(ctx, func(q store.Queries) error {
		return q.CreateSigner(ctx, &store.Signer{Fingerprint: "sha256:00", Name: "s", PublicKey: []byte{1}, CreatedAt: time.Now()})
	}); err != nil {
		t.Fatal(err)
	}
	wantMode(t, dir, 0o700)
	for _, f := range []string{SQLiteFile, SQLiteFile + "-wal", SQLiteFile + "-shm", InitAdminFile} {
		wantMode(t, filepath.Join(dir, f), 0o600)
	}
}

// A loose database left by an older tetherd is made 0600 at the next start.
func TestLooseDatabaseIsTightened(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, SQLiteFile)
	if err := os.WriteFile(db, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(db, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := privateSQLite(dir, db); err != nil {
		t.Fatal(err)
	}
	wantMode(t, db, 0o600)
}

func wantMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != want {
		t.Errorf("%s has mode %04o, want %04o", filepath.Base(path), got, want)
	}
}
