package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tetherfleet/tether/controlplane/backup"
	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/pki/ca"
)

// BackupOptions configure Backup.
type BackupOptions struct {
	DataDir string
	// Out is the archive to write; it must not exist.
	Out string
	// Store is the serve --store of this data dir: a PostgreSQL database
	// is backed up with PostgreSQL's own tools, and needs KeysOnly here.
	Store string
	// KeysOnly leaves out the database and the module blobs.
	KeysOnly   bool
	Encryption backup.Encryption
	Clock      clock.Clock
	Progress   func(done, total int64, name string)
}

// Backup writes a consistent online backup of a data dir: its keys and
// certificates, a snapshot of the SQLite database taken while tetherd
// serves it, and the module blobs.
func Backup(ctx context.Context, o BackupOptions) (backup.Manifest, error) {
	if o.DataDir == "" || o.Out == "" {
		return backup.Manifest{}, errors.New("backup: --data-dir and --out are required")
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	authority, err := ca.Load(filepath.Join(o.DataDir, CADir), o.Clock)
	if err != nil {
		return backup.Manifest{}, fmt.Errorf("backup: %s is not a Tether data dir: %w", o.DataDir, err)
	}
	src := backup.Source{DataDir: o.DataDir, KeysOnly: o.KeysOnly, CAFingerprint: authority.Fingerprint(), Skip: notBackedUp,
		Now: o.Clock.Now, Progress: o.Progress, Store: "sqlite"}
	if strings.HasPrefix(o.Store, "postgres") {
		if !o.KeysOnly {
			return backup.Manifest{}, errors.New("backup: this data dir's database is in PostgreSQL: back the database up with pg_dump or point-in-time recovery " +
				"(docs/operator-guide.md#day-two), and the data dir's files with `tetherd backup --keys-only`")
		}
		src.Store = "postgres"
	}
	if !o.KeysOnly {
		db := filepath.Join(o.DataDir, SQLiteFile)
		if _, err := os.Stat(db); err != nil {
			return backup.Manifest{}, fmt.Errorf("backup: no SQLite database in %s (%w); a data dir whose store is PostgreSQL takes --keys-only", o.DataDir, err)
		}
		src.Snapshot = func(ctx context.Context, dst string) error { return sqlite.Snapshot(ctx, db, dst) }
		src.SchemaVersion = sqlite.DatabaseSchema
	}
	return backup.Create(ctx, src, o.Encryption, o.Out)
}

// notBackedUp are the parts of a data dir a backup leaves out: machine
// state (VM disks, sockets and pid files of processes a restore cannot
// bring back), uploads in flight, and anything that is not a plain file.
func notBackedUp(rel string, d fs.DirEntry) bool {
	switch rel {
	case MachineDir, LibvirtDir, BlobDir + "/tmp":
		return true
	}
	return !d.IsDir() && !d.Type().IsRegular()
}

// Restore rebuilds a data dir from a backup. The folder must be new or
// empty; tetherd's first start on it records what the backup could not
// hold in an event (recordRestore).
func Restore(ctx context.Context, in, dataDir string, dec backup.Decryption, progress func(done, total int64, name string)) (backup.Manifest, error) {
	return backup.Restore(ctx, in, dec, dataDir, backup.RestoreOptions{MaxSchema: sqlite.SchemaVersion(), Progress: progress})
}

// recordRestore writes the event of a restore on the first start after
// it: everything written after the backup was taken is gone, and an
// operator must hear it from tetherd, never find it out.
func recordRestore(ctx context.Context, st store.Store, dataDir string, now time.Time, log *slog.Logger) error {
	mk, ok, err := backup.ReadMarker(dataDir)
	if err != nil || !ok {
		return err
	}
	lost := time.Duration(0)
	if mk.Restored.After(mk.BackupCreated) {
		lost = mk.Restored.Sub(mk.BackupCreated).Round(time.Second)
	}
	msg := fmt.Sprintf("restored from a backup taken at %s, %s before the restore: anything written after it is lost "+
		"(instances, claims, tasks, events and audit records of that time, and the certificates of agents that enrolled then)",
		mk.BackupCreated.Format(time.RFC3339), lost)
	if mk.KeysOnly {
		msg = fmt.Sprintf("restored the keys and certificates of a backup taken at %s; the database came from elsewhere", mk.BackupCreated.Format(time.RFC3339))
	}
	if n := len(mk.MissingBlobs); n > 0 {
		msg += fmt.Sprintf("; %d module blobs deleted while the backup ran are missing", n)
	}
	if err := st.Tx(ctx, func(q store.Queries) error {
		_, err := events.E{Kind: events.ControlPlaneRestored, Severity: events.High, Message: msg,
			Payload: events.RestoredPayload{BackupCreatedAt: mk.BackupCreated.Format(time.RFC3339Nano), RestoredAt: mk.Restored.Format(time.RFC3339Nano),
				KeysOnly: mk.KeysOnly, MissingBlobs: len(mk.MissingBlobs)}}.Write(ctx, q, now)
		return err
	}); err != nil {
		return fmt.Errorf("serve: record the restore: %w", err)
	}
	log.Warn(msg)
	return backup.ClearMarker(dataDir)
}
