package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/tetherfleet/tether/controlplane/store"
)

const poolCols = `id, name, template_id, provider, region, instance_type, lifecycle_class, target_size, min_size, max_size,
	status, metadata, last_replenished_at, created_at, updated_at`

func scanPool(s scanner) (*store.Pool, error) {
	var p store.Pool
	var meta string
	var last sql.NullInt64
	var created, updated int64
	if err := s.Scan(&p.ID, &p.Name, &p.TemplateID, &p.Provider, &p.Region, &p.InstanceType, &p.LifecycleClass, &p.TargetSize, &p.MinSize, &p.MaxSize,
		&p.Status, &meta, &last, &created, &updated); err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(meta), &p.Metadata); err != nil {
		return nil, fmt.Errorf("pool %s metadata: %w", p.Name, err)
	}
	p.LastReplenishedAt, p.CreatedAt, p.UpdatedAt = fromNTS(last), fromTS(created), fromTS(updated)
	return &p, nil
}

func poolMeta(p *store.Pool) string {
	b, _ := json.Marshal(p.Metadata)
	return string(b)
}

func (q *queries) CreatePool(ctx context.Context, p *store.Pool) error {
	if p.ID == "" {
		p.ID = newID()
	}
	_, err := q.exec(ctx, `INSERT INTO pools (`+poolCols+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		p.ID, p.Name, p.TemplateID, p.Provider, p.Region, p.InstanceType, p.LifecycleClass, p.TargetSize, p.MinSize, p.MaxSize,
		p.Status, poolMeta(p), nts(p.LastReplenishedAt), ts(p.CreatedAt), ts(p.UpdatedAt))
	if err != nil {
		return fmt.Errorf("create pool %q: %w", p.Name, err)
	}
	return nil
}

func (q *queries) getPool(ctx context.Context, where, key, suffix string) (*store.Pool, error) {
	p, err := scanPool(q.row(ctx, `SELECT `+poolCols+` FROM pools WHERE `+where+` = ?`+suffix, key))
	if err != nil {
		return nil, notFound(q.db.classify(err), "pool", key)
	}
	return p, nil
}

func (q *queries) GetPool(ctx context.Context, name string) (*store.Pool, error) {
	return q.getPool(ctx, "name", name, "")
}

func (q *queries) GetPoolByID(ctx context.Context, id string) (*store.Pool, error) {
	return q.getPool(ctx, "id", id, "")
}

func (q *queries) LockPool(ctx context.Context, id string) (*store.Pool, error) {
	return q.getPool(ctx, "id", id, q.db.dialect.LockRow())
}

func (q *queries) ListPools(ctx context.Context, p store.Page) ([]*store.Pool, error) {
	p = p.Normalize()
	rows, err := q.query(ctx, `SELECT `+poolCols+` FROM pools WHERE name > ? ORDER BY name LIMIT ?`, p.After, p.Limit)
	if err != nil {
		return nil, fmt.Errorf("list pools: %w", err)
	}
	out, err := collect(rows, scanPool)
	if err != nil {
		return nil, fmt.Errorf("list pools: %w", err)
	}
	return out, nil
}

func (q *queries) UpdatePool(ctx context.Context, p *store.Pool) error {
	res, err := q.exec(ctx, `UPDATE pools SET template_id = ?, provider = ?, region = ?, instance_type = ?, lifecycle_class = ?,
		target_size = ?, min_size = ?, max_size = ?, status = ?, metadata = ?, last_replenished_at = ?, updated_at = ? WHERE id = ?`,
		p.TemplateID, p.Provider, p.Region, p.InstanceType, p.LifecycleClass, p.TargetSize, p.MinSize, p.MaxSize,
		p.Status, poolMeta(p), nts(p.LastReplenishedAt), ts(p.UpdatedAt), p.ID)
	return mustAffect(res, err, "pool", p.Name)
}

func (q *queries) DeletePool(ctx context.Context, id string) error {
	var live int
	if err := q.row(ctx, `SELECT COUNT(*) FROM instances WHERE pool_id = ? AND status <> 'terminated'`, id).Scan(&live); err != nil {
		return fmt.Errorf("delete pool: %w", q.db.classify(err))
	}
	if live > 0 {
		return store.Errorf(store.ErrConflict, "pool has %d members that are not terminated", live)
	}
	res, err := q.exec(ctx, `DELETE FROM pools WHERE id = ?`, id)
	return mustAffect(res, err, "pool", id)
}

func (q *queries) CountPoolMembers(ctx context.Context, poolID string) (store.PoolCounts, error) {
	var c store.PoolCounts
	rows, err := q.query(ctx, `SELECT pool_state, COUNT(*) FROM instances WHERE pool_id = ? AND status <> 'terminated' GROUP BY pool_state`, poolID)
	if err != nil {
		return c, fmt.Errorf("count pool members: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var state string
		var n int
		if err := rows.Scan(&state, &n); err != nil {
			return c, fmt.Errorf("count pool members: %w", err)
		}
		switch state {
		case store.PoolStateWarming:
			c.Warming = n
		case store.PoolStateReady:
			c.Ready = n
		case store.PoolStateClaimed:
			c.Claimed = n
		case store.PoolStateDraining:
			c.Draining = n
		case store.PoolStateErrored:
			c.Errored = n
		}
	}
	return c, rows.Err()
}

func (q *queries) ClaimPoolMember(ctx context.Context, poolID, class string) (*store.Instance, error) {
	conds := `i.pool_state = 'ready' AND i.status = 'running' AND i.terminate_requested_at IS NULL AND p.status = 'active'`
	var args []any
	if poolID != "" {
		conds += ` AND i.pool_id = ?`
		args = append(args, poolID)
	}
	if class != "" {
		conds += ` AND p.lifecycle_class = ?`
		args = append(args, class)
	}
	// FOR UPDATE OF i: only the member row is locked, so claimers of
	// different members of one pool do not queue behind each other.
	lock := q.db.dialect.SkipLocked()
	if lock != "" {
		lock = " FOR UPDATE OF i SKIP LOCKED"
	}
	in, err := scanInstance(q.row(ctx, `SELECT `+prefixCols("i.", instanceCols)+` FROM instances i JOIN pools p ON p.id = i.pool_id
		WHERE `+conds+` ORDER BY i.pool_warming_started_at, i.id LIMIT 1`+lock, args...))
	if err != nil {
		return nil, notFound(q.db.classify(err), "ready member in pool", poolID)
	}
	return in, nil
}

func (q *queries) DeletePoolMember(ctx context.Context, id string) error {
	res, err := q.exec(ctx, `DELETE FROM instances WHERE id = ? AND pool_id IS NOT NULL AND status IN ('terminated', 'error')`, id)
	if err != nil {
		return fmt.Errorf("delete pool member %s: %w", id, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("delete pool member %s: %w", id, q.db.classify(err))
	} else if n == 1 {
		return nil
	}
	in, err := q.GetInstance(ctx, id)
	if err != nil {
		return err
	}
	return store.Errorf(store.ErrConflict, "instance %s is %s (pool %q): only a dead pool member's row may be deleted", id, in.Status, in.PoolID)
}
