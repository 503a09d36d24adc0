package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
)

const tokenCols = `hash, instance_id, expires_at, used_at, created_at, spent_key`

func scanToken(s scanner) (*store.Token, error) {
	var t store.Token
	var expires, created int64
	var used sql.NullInt64
	if err := s.Scan(&t.Hash, &t.InstanceID, &expires, &used, &created, &t.SpentKey); err != nil {
		return nil, err
	}
	t.ExpiresAt, t.UsedAt, t.CreatedAt = fromTS(expires), fromNTS(used), fromTS(created)
	return &t, nil
}

func (q *queries) CreateToken(ctx context.Context, t *store.Token) error {
	_, err := q.exec(ctx, `INSERT INTO tokens (`+tokenCols+`) VALUES (?,?,?,?,?,?)`,
		t.Hash, string(t.InstanceID), ts(t.ExpiresAt), nts(t.UsedAt), ts(t.CreatedAt), t.SpentKey)
	if err != nil {
		return fmt.Errorf("create token for instance %s: %w", t.InstanceID, err)
	}
	return nil
}

func (q *queries) GetToken(ctx context.Context, hash string) (*store.Token, error) {
	t, err := scanToken(q.row(ctx, `SELECT `+tokenCols+` FROM tokens WHERE hash = ?`, hash))
	if err != nil {
		// The hash is not secret, but there is no reason to echo it.
		return nil, notFound(q.db.classify(err), "token", "")
	}
	return t, nil
}

func (q *queries) ConsumeToken(ctx context.Context, hash, spentKey string, now time.Time) (*store.Token, error) {
	// One conditional UPDATE decides: two enrollments racing on the same
	// token cannot both see it unused.
	t, err := scanToken(q.row(ctx, `UPDATE tokens SET used_at = ?, spent_key = ? WHERE hash = ? AND used_at IS NULL AND expires_at > ? RETURNING `+tokenCols,
		ts(now), spentKey, hash, ts(now)))
	if err == nil {
		return t, nil
	}
	if err = q.db.classify(err); err != sql.ErrNoRows {
		return nil, fmt.Errorf("consume token: %w", err)
	}
	// Find out why, for the caller's audit trail (never for the client).
	t, err = q.GetToken(ctx, hash)
	if err != nil {
		return nil, err
	}
	if t.UsedAt != nil {
		return t, fmt.Errorf("%w: %w", store.ErrConflict, store.ErrTokenUsed)
	}
	return t, fmt.Errorf("%w: %w", store.ErrConflict, store.ErrTokenExpired)
}

func (q *queries) ExpireInstanceTokens(ctx context.Context, instanceID store.InstanceID, now time.Time) (int, error) {
	res, err := q.exec(ctx, `UPDATE tokens SET expires_at = ? WHERE instance_id = ? AND used_at IS NULL AND expires_at > ?`,
		ts(now), string(instanceID), ts(now))
	if err != nil {
		return 0, fmt.Errorf("expire tokens of %s: %w", instanceID, err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}
