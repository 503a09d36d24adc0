package sqlite_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/controlplane/store/sqlite"
)

// The loops' reads that run every tick go through indexes that visit only
// the rows they want, not the status index, which visited every running
// or booting instance (migrations 0007 and 0008). SQLite has no
// statistics here, so this pins the planner's choice.
func TestLoopReadsUseTheirIndexes(t *testing.T) {
	ctx := context.Background()
	s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cases := []struct {
		name, query, want string
		// seeksOnly: the plan is three seeks of want and builds no
		// temporary b-tree.
		seeksOnly bool
	}{
		{
			name: "terminate reconciler",
			query: `SELECT id FROM instances
		WHERE id > ? AND status IN ('provisioning', 'running', 'stopping', 'stopped', 'starting', 'rebooting', 'terminating', 'error')
		AND terminate_requested_at IS NOT NULL ORDER BY id LIMIT 1000`,
			want: "instances_terminate_requested (status=? AND terminate_requested_at>?)",
		},
		{
			name: "boot timeouts",
			query: `SELECT id FROM instances
		WHERE 1 = 1 AND status IN ('provisioning', 'starting', 'rebooting') AND updated_at < ? AND id > ? ORDER BY id LIMIT 1000`,
			want: "instances_status_updated (status=? AND updated_at<?)",
		},
		{
			// Every new agent stream runs it once (store.AgentWork).
			name: "stream's task check",
			query: `SELECT id FROM (SELECT id FROM tasks WHERE status = 'pending' AND target = ? AND instance_id = ? LIMIT 1) AS p
	UNION ALL SELECT id FROM tasks WHERE status = 'leased' AND target = ? AND instance_id = ? AND cancel_requested = ?
	UNION ALL SELECT id FROM tasks WHERE status = 'running' AND target = ? AND instance_id = ? AND cancel_requested = ?`,
			want:      "SEARCH tasks USING INDEX tasks_claim (status=? AND target=? AND instance_id=?)",
			seeksOnly: true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := strings.Count(tc.query, "?")
			args := make([]any, n)
			for i := range args {
				args[i] = ""
			}
			rows, err := s.SQL().QueryContext(ctx, `EXPLAIN QUERY PLAN `+tc.query, args...)
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
			got := strings.Join(plan, "; ")
			if !strings.Contains(got, tc.want) {
				t.Fatalf("plan = %q, want %q", got, tc.want)
			}
			if tc.seeksOnly && (strings.Contains(got, "TEMP B-TREE") || strings.Count(got, tc.want) != 3) {
				t.Fatalf("plan = %q, want three seeks of %q and no temporary b-tree", got, tc.want)
			}
		})
	}
}
