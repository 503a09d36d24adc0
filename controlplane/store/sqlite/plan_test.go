package sqlite_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/controlplane/store/sqlite"
)

// The terminate reconciler's read, every loop tick, goes through the
// partial index of instances with a terminate intent, not the status
// index, which visited every running instance (migration 0007). SQLite
// has no statistics here, so this pins the planner's choice.
func TestTerminateReconcilerReadUsesItsIndex(t *testing.T) {
	ctx := context.Background()
	s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rows, err := s.SQL().QueryContext(ctx, `EXPLAIN QUERY PLAN SELECT id FROM instances
		WHERE id > ? AND status IN ('provisioning', 'running', 'stopping', 'stopped', 'starting', 'rebooting', 'terminating', 'error')
		AND terminate_requested_at IS NOT NULL ORDER BY id LIMIT 1000`, "")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, notused int
		var detail string
		if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(plan, "; "); !strings.Contains(got, "instances_terminate_requested") {
		t.Fatalf("plan = %q, want the instances_terminate_requested index", got)
	}
}
