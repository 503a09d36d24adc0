package sqlite

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
)

// A snapshot taken while the store is open holds what was committed, opens
// as a database of the current schema, and never overwrites a file.
func TestSnapshotOfAnOpenStore(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "tether.db")
	st, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Tx(ctx, func(q store.Queries) error {
		return q.AppendEvent(ctx, &store.Event{Kind: "before.snapshot", Severity: store.SeverityLow, CreatedAt: time.Now()})
	}); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "snap.db")
	if err := Snapshot(ctx, path, dst); err != nil {
		t.Fatal(err)
	}
	if err := Snapshot(ctx, path, dst); err == nil {
		t.Fatal("a snapshot overwrote an existing file")
	}
	if st, _ := os.Stat(dst); st.Mode().Perm() != 0o600 {
		t.Fatalf("snapshot mode %v, want 0600", st.Mode().Perm())
	}
	v, err := DatabaseSchema(ctx, dst)
	if err != nil || v != SchemaVersion() || v == 0 {
		t.Fatalf("snapshot schema %d, %v; this build's is %d", v, err, SchemaVersion())
	}
	snap, err := Open(ctx, dst)
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Close()
	evs, err := snap.ListEvents(ctx, store.EventFilter{Kind: "before.snapshot"}, store.Page{})
	if err != nil || len(evs) != 1 {
		t.Fatalf("the snapshot holds %d committed events (%v), want 1", len(evs), err)
	}
}
