package postgres_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Keys are COLLATE "C" (migration 0001), so a key column made with the
// database's default collation cannot use its index when compared with
// one: PostgreSQL then scans. agent_presence.instance_id was such a column,
// and every claim scanned all presence rows. This holds every key column
// of the migrated schema to "C".
func TestKeyColumnsAreCollateC(t *testing.T) {
	dsn := pg.DSN(t)
	open(t, dsn, fastOpts) // migrates
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	rows, err := c.Query(ctx, `SELECT table_name, column_name, COALESCE(collation_name, '') FROM information_schema.columns
		WHERE table_schema = current_schema() AND data_type = 'text' AND (column_name = 'id' OR column_name LIKE '%\_id')
		ORDER BY table_name, column_name`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	// Opaque values compared only with parameters, never joined with a key.
	opaque := map[string]bool{"agent_presence.stream_id": true, "instances.boot_id": true,
		"instances.claim_id": true, "instances.cloud_instance_id": true}
	n := 0
	for rows.Next() {
		var table, col, coll string
		if err := rows.Scan(&table, &col, &coll); err != nil {
			t.Fatal(err)
		}
		n++
		if coll != "C" && !opaque[table+"."+col] {
			t.Errorf(`%s.%s is collated %q; a key column must be TEXT COLLATE "C"`, table, col, coll)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("no key columns found: the query no longer looks at the schema")
	}
}
