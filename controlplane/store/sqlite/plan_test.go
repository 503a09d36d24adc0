package sqlite_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
)

// The reads that run on every loop tick, every stream and every claim go
// through indexes that visit only the rows they want, not the status
// index, which visited every running or booting instance (migrations 0007
// and 0008). SQLite has no statistics here, so this pins the planner's
// choice. The statements are captured as the store runs them (each case
// calls the store the way its caller does), so a query that drifts off its
// index fails here; nothing is a copy of the store's SQL.
func TestLoopReadsUseTheirIndexes(t *testing.T) {
	ctx := context.Background()
	s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	at := time.Date(2026, 12, 4, 4, 0, 0, 0, time.UTC)
	nonTerminal := []lifecycle.State{}
	for _, st := range lifecycle.States() {
		if !st.Terminal() {
			nonTerminal = append(nonTerminal, st)
		}
	}
	cases := []struct {
		name string
		// run calls the store as the caller named does.
		run func() error
		// of picks the statement to explain among those run captured.
		of   string
		want []string
		// seeksOnly: the plan is three seeks of want[0] and builds no
		// temporary b-tree.
		seeksOnly bool
		// noSort: the order comes from the index, not a temporary b-tree.
		noSort bool
	}{
		{
			name: "terminate reconciler (instances.ResumeTerminates)",
			run: func() error {
				_, err := s.ListInstances(ctx, store.InstanceFilter{TerminateRequested: true, Statuses: nonTerminal}, store.Page{Limit: store.MaxPageSize})
				return err
			},
			of:   "FROM instances",
			want: []string{"instances_terminate_requested (status=? AND terminate_requested_at>?)"},
		},
		{
			name: "boot timeouts (liveness)",
			run: func() error {
				_, err := s.ListInstances(ctx, store.InstanceFilter{Statuses: []lifecycle.State{lifecycle.Provisioning, lifecycle.Starting, lifecycle.Rebooting},
					UpdatedBefore: &at}, store.Page{Limit: 1000})
				return err
			},
			of:   "FROM instances",
			want: []string{"instances_status_updated (status=? AND updated_at<?)"},
		},
		{
			// Every new agent stream runs it once.
			name: "stream's task check (AgentWork)",
			run: func() error {
				_, _, err := s.AgentWork(ctx, "i-1")
				return err
			},
			of:        "FROM tasks",
			want:      []string{"SEARCH tasks USING INDEX tasks_claim (status=? AND target=? AND instance_id=?)"},
			seeksOnly: true,
		},
		{
			// The claim walks the pool's ready members in warming order and
			// probes each one's presence by its key (design §2.10).
			name: "claim (pool.Acquire)",
			run: func() error {
				err := s.Tx(ctx, func(q store.Queries) error {
					_, err := q.ClaimPoolMembers(ctx, "p-1", "", []store.PoolClaim{{ClaimID: "c"}}, at)
					return err
				})
				if errors.Is(err, store.ErrNotFound) {
					return nil // no member: the statement ran all the same
				}
				return err
			},
			of: "FROM instances i JOIN pools p",
			want: []string{"SEARCH i USING INDEX instances_pool (pool_id=? AND pool_state=?)",
				"SEARCH ap EXISTS USING INDEX sqlite_autoindex_agent_presence_1 (instance_id=?)"},
			noSort: true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var ran []string
			stop := s.ObserveStatements(func(q string) { ran = append(ran, q) })
			err := tc.run()
			stop()
			if err != nil {
				t.Fatal(err)
			}
			var query string
			for _, q := range ran {
				if strings.HasPrefix(strings.TrimSpace(q), "SELECT") && strings.Contains(q, tc.of) {
					query = q
					break
				}
			}
			if query == "" {
				t.Fatalf("no SELECT %s among the statements the store ran: %q", tc.of, ran)
			}
			got := explain(t, s, query)
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Fatalf("plan of the store's\n%s\n= %q, want %q", query, got, w)
				}
			}
			if tc.noSort && strings.Contains(got, "TEMP B-TREE") {
				t.Fatalf("plan = %q sorts in a temporary b-tree; the index gives the order", got)
			}
			if tc.seeksOnly && (strings.Contains(got, "TEMP B-TREE") || strings.Count(got, tc.want[0]) != 3) {
				t.Fatalf("plan = %q, want three seeks of %q and no temporary b-tree", got, tc.want[0])
			}
		})
	}
}

// explain is SQLite's plan of query, its placeholders bound to "" (a plan
// does not depend on the values).
func explain(t *testing.T, s *sqlite.Store, query string) string {
	t.Helper()
	args := make([]any, strings.Count(query, "?"))
	for i := range args {
		args[i] = ""
	}
	rows, err := s.SQL().QueryContext(context.Background(), `EXPLAIN QUERY PLAN `+query, args...)
	if err != nil {
		t.Fatalf("explain %s: %v", query, err)
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
	return strings.Join(plan, "; ")
}
