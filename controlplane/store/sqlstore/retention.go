package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
)

func (q *queries) PruneRecords(ctx context.Context, tasksBefore, tokensBefore, certsBefore time.Time, limit int) (store.Pruned, error) {
	var p store.Pruned
	for _, step := range []struct {
		what  string
		query string
		arg   time.Time
		n     *int64
	}{
		{"tasks", limited("tasks", "id", `status IN ('succeeded', 'failed', 'cancelled') AND updated_at < ?`, "", limit), tasksBefore, &p.Tasks},
		{"tokens", limited("tokens", "hash", `expires_at < ?`, "", limit), tokensBefore, &p.Tokens},
		{"certificates", limited("certificates", "serial", `not_after < ?`, "", limit), certsBefore, &p.Certificates},
	} {
		res, err := q.exec(ctx, step.query, ts(step.arg))
		if err != nil {
			return p, fmt.Errorf("prune %s: %w", step.what, err)
		}
		if *step.n, err = res.RowsAffected(); err != nil {
			return p, fmt.Errorf("prune %s: %w", step.what, err)
		}
	}
	return p, nil
}

// limited is a DELETE of table's rows matching where: all of them when
// limit <= 0, else at most limit, the smallest by order first (any, when
// order is empty: a table without an index on the column would sort every
// match for each batch). It selects the keys in a subquery because
// neither store takes LIMIT on a DELETE itself (SQLite only when built
// with an option).
func limited(table, key, where, order string, limit int) string {
	if limit <= 0 {
		return "DELETE FROM " + table + " WHERE " + where
	}
	if order != "" {
		order = " ORDER BY " + order
	}
	return fmt.Sprintf("DELETE FROM %s WHERE %s IN (SELECT %s FROM %s WHERE %s%s LIMIT %d)", table, key, key, table, where, order, limit)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
