package sqlstore

import (
	"context"
	"fmt"

	"github.com/tetherfleet/tether/controlplane/store"
)

// BatchResult is what one function of a batch did.
type BatchResult struct {
	Err error
	// AfterCommit must run once the batch has committed (notifications).
	AfterCommit []func()
}

// RunBatch runs fns in one transaction, each inside its own savepoint: a
// function that fails is rolled back alone, as if it had been a
// transaction of its own, and the rest commit together with one sync. It
// returns one result per function, and an error when the transaction
// itself could not begin or commit (then nothing was kept).
//
// This is group commit for a single-writer database: callers that would
// each wait for their own fsync share one.
func (d *DB) RunBatch(ctx context.Context, fns []func(q store.Queries) error) ([]BatchResult, error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, d.classify(fmt.Errorf("begin transaction: %w", err))
	}
	results := make([]BatchResult, len(fns))
	for i, fn := range fns {
		if _, err := tx.ExecContext(ctx, "SAVEPOINT tether_batch"); err != nil {
			_ = tx.Rollback()
			return nil, d.classify(fmt.Errorf("savepoint: %w", err))
		}
		q := &queries{ex: tx, db: d, inTx: true, shared: true}
		err := fn(q)
		if err == nil {
			// Each function's events are its own, kept or rolled back
			// with its savepoint.
			err = q.flushEvents(ctx)
		}
		if err != nil {
			results[i].Err = err
			if _, rerr := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT tether_batch"); rerr != nil {
				_ = tx.Rollback()
				return nil, d.classify(fmt.Errorf("roll back to savepoint: %w", rerr))
			}
		} else {
			results[i].AfterCommit = q.afterCommit
		}
		if _, err := tx.ExecContext(ctx, "RELEASE SAVEPOINT tether_batch"); err != nil {
			_ = tx.Rollback()
			return nil, d.classify(fmt.Errorf("release savepoint: %w", err))
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, d.classify(commitErr(ctx, err))
	}
	return results, nil
}
