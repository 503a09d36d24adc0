package daemon

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBackupRefuses(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	if err := Init(InitOptions{DataDir: data}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		o    BackupOptions
		want string
	}{
		{"no data dir", BackupOptions{Out: "x"}, "required"},
		{"not a data dir", BackupOptions{DataDir: t.TempDir(), Out: filepath.Join(t.TempDir(), "b")}, "not a Tether data dir"},
		{"a PostgreSQL store, whole", BackupOptions{DataDir: data, Store: "postgres://db/tether", Out: filepath.Join(t.TempDir(), "b")}, "pg_dump"},
		{"no database yet", BackupOptions{DataDir: data, Out: filepath.Join(t.TempDir(), "b")}, "no SQLite database"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Backup(context.Background(), tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Backup = %v, want %q", err, tc.want)
			}
			if tc.o.Out != "" {
				if _, err := os.Stat(tc.o.Out); err == nil {
					t.Fatalf("a refused backup left %s", tc.o.Out)
				}
			}
		})
	}
	// A PostgreSQL data dir's files alone.
	m, err := Backup(context.Background(), BackupOptions{DataDir: data, Store: "postgres://db/tether", KeysOnly: true, Out: filepath.Join(t.TempDir(), "keys")})
	if err != nil || !m.KeysOnly || m.Store != "postgres" {
		t.Fatalf("keys-only backup of a PostgreSQL data dir: %+v, %v", m, err)
	}
}
