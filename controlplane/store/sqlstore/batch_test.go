package sqlstore

import (
	"context"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
)

// A caller that gives up while its statement runs inside a group commit
// must not take the batch with it: SQLite rolls the whole transaction back
// on an interrupted write, and the others' savepoints went too.
func TestBatchOutlivesACallerThatGivesUp(t *testing.T) {
	d := openTestDB(t)
	ctx := context.Background()
	const ins = `INSERT INTO kv (k, v) VALUES (?, 1)`
	// A write that runs for a second or so unless interrupted: it counts to
	// 2e6 and inserts nothing.
	const slow = `INSERT INTO kv (k, v) WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 2000000)
		SELECT 'never', x FROM c WHERE x < 0`
	gaveUp, cancel := context.WithCancel(ctx)
	defer cancel()
	results, err := d.RunBatch(ctx, []func(q store.Queries) error{
		func(q store.Queries) error { _, err := q.(*queries).exec(ctx, ins, "before"); return err },
		func(q store.Queries) error {
			// The caller gives up once its statement is under way.
			time.AfterFunc(20*time.Millisecond, cancel)
			_, err := q.(*queries).exec(gaveUp, slow)
			return err
		},
		func(q store.Queries) error { _, err := q.(*queries).exec(ctx, ins, "after"); return err },
	})
	if err != nil {
		t.Fatalf("the batch failed with one caller: %v", err)
	}
	for i, r := range results {
		if r.Err != nil {
			t.Errorf("function %d: %v", i, r.Err)
		}
	}
	var n int
	if err := d.SQL().QueryRow(`SELECT count(*) FROM kv WHERE k IN ('before', 'after')`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d of the other callers' rows committed (%v), want 2", n, err)
	}
}
