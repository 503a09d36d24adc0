package sqlite

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/controlplane/store/sqlstore"
)

// A database a newer build migrated is refused at start-up, naming the
// migration the build lacks, and left as it was.
func TestOpenRefusesANewerSchema(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "tether.db")
	st, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	next := SchemaVersion() + 1
	if _, err := st.SQL().ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, 0)`,
		next, fmt.Sprintf("%04d_from_the_future.sql", next)); err != nil {
		t.Fatal(err)
	}
	st.Close()
	_, err = Open(ctx, path)
	if !errors.Is(err, sqlstore.ErrSchemaNewer) || !strings.Contains(err.Error(), "from_the_future") {
		t.Fatalf("Open of a newer schema = %v, want ErrSchemaNewer naming the migration", err)
	}
	if v, err := DatabaseSchema(ctx, path); err != nil || v != next {
		t.Fatalf("the refused database's schema is %d (%v), want it left at %d", v, err, next)
	}
}
