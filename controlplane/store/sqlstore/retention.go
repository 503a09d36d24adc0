package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
)

func (q *queries) PruneRecords(ctx context.Context, tasksBefore, tokensBefore, certsBefore time.Time) (store.Pruned, error) {
	var p store.Pruned
	for _, step := range []struct {
		what  string
		query string
		arg   time.Time
		n     *int64
	}{
		{"tasks", `DELETE FROM tasks WHERE status IN ('succeeded', 'failed', 'cancelled') AND updated_at < ?`, tasksBefore, &p.Tasks},
		{"tokens", `DELETE FROM tokens WHERE expires_at < ?`, tokensBefore, &p.Tokens},
		{"certificates", `DELETE FROM certificates WHERE not_after < ?`, certsBefore, &p.Certificates},
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
