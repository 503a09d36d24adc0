package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/tetherfleet/tether/controlplane/lifecycle"
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
		p.ID = store.PoolID(newID())
	}
	_, err := q.exec(ctx, `INSERT INTO pools (`+poolCols+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		string(p.ID), p.Name, p.TemplateID, p.Provider, p.Region, p.InstanceType, p.LifecycleClass, p.TargetSize, p.MinSize, p.MaxSize,
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

func (q *queries) GetPoolByID(ctx context.Context, id store.PoolID) (*store.Pool, error) {
	return q.getPool(ctx, "id", string(id), "")
}

func (q *queries) LockPool(ctx context.Context, id store.PoolID) (*store.Pool, error) {
	return q.getPool(ctx, "id", string(id), q.db.dialect.LockRow())
}

func (q *queries) ListPools(ctx context.Context, p store.Page) ([]*store.Pool, error) {
	p = p.Normalize()
	rows, err := q.query(ctx, `SELECT `+poolCols+` FROM pools WHERE name > ? ORDER BY name LIMIT ?`, p.After, p.Limit)
	if err != nil {
		return nil, fmt.Errorf("list pools: %w", err)
	}
	out, err := collect(q, rows, scanPool)
	if err != nil {
		return nil, fmt.Errorf("list pools: %w", err)
	}
	return out, nil
}

func (q *queries) UpdatePool(ctx context.Context, p *store.Pool) error {
	res, err := q.exec(ctx, `UPDATE pools SET template_id = ?, provider = ?, region = ?, instance_type = ?, lifecycle_class = ?,
		target_size = ?, min_size = ?, max_size = ?, status = ?, metadata = ?, last_replenished_at = ?, updated_at = ? WHERE id = ?`,
		p.TemplateID, p.Provider, p.Region, p.InstanceType, p.LifecycleClass, p.TargetSize, p.MinSize, p.MaxSize,
		p.Status, poolMeta(p), nts(p.LastReplenishedAt), ts(p.UpdatedAt), string(p.ID))
	return mustAffect(res, err, "pool", p.Name)
}

func (q *queries) DeletePool(ctx context.Context, id store.PoolID) error {
	var live int
	if err := q.row(ctx, `SELECT COUNT(*) FROM instances WHERE pool_id = ? AND status <> 'terminated'`, string(id)).Scan(&live); err != nil {
		return fmt.Errorf("delete pool: %w", q.db.classify(err))
	}
	if live > 0 {
		return store.Errorf(store.ErrConflict, "pool has %d members that are not terminated", live)
	}
	res, err := q.exec(ctx, `DELETE FROM pools WHERE id = ?`, string(id))
	return mustAffect(res, err, "pool", id)
}

func (q *queries) CountPoolMembers(ctx context.Context, poolID store.PoolID) (store.PoolCounts, error) {
	var c store.PoolCounts
	rows, err := q.query(ctx, `SELECT pool_state, COUNT(*) FROM instances WHERE pool_id = ? AND status <> 'terminated' GROUP BY pool_state`, string(poolID))
	if err != nil {
		return c, fmt.Errorf("count pool members: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var n int
		if err := rows.Scan(&name, &n); err != nil {
			return c, fmt.Errorf("count pool members: %w", err)
		}
		state, err := parseStoredPoolState(name)
		if err != nil {
			return c, fmt.Errorf("count pool members of %s: %w", poolID, err)
		}
		switch state {
		case lifecycle.PoolWarming:
			c.Warming = n
		case lifecycle.PoolReady:
			c.Ready = n
		case lifecycle.PoolClaimed:
			c.Claimed = n
		case lifecycle.PoolDraining:
			c.Draining = n
		case lifecycle.PoolErrored:
			c.Errored = n
		}
	}
	return c, rows.Err()
}

func (q *queries) ClaimPoolMember(ctx context.Context, poolID store.PoolID, class string, at time.Time) (*store.Instance, error) {
	ins, err := q.readyMembers(ctx, poolID, class, 1, at)
	if err != nil {
		return nil, err
	}
	return ins[0], nil
}

// readyMembers locks up to n ready members of active pools, oldest first,
// whose agent is present at at (a live stream on some replica, its lease
// unexpired): a row alone is no evidence that the machine still runs.
func (q *queries) readyMembers(ctx context.Context, poolID store.PoolID, class string, n int, at time.Time) ([]*store.Instance, error) {
	conds := `i.pool_state = 'ready' AND i.status = 'running' AND i.terminate_requested_at IS NULL AND p.status = 'active' AND ` + livePresence
	args := []any{ts(at)}
	if poolID != "" {
		conds += ` AND i.pool_id = ?`
		args = append(args, string(poolID))
	}
	if class != "" {
		conds += ` AND p.lifecycle_class = ?`
		args = append(args, class)
	}
	args = append(args, n)
	// FOR UPDATE OF i: only the member rows are locked, so claimers of
	// different members of one pool do not queue behind each other. The
	// order is instances_pool's own (no id tie-break), so PostgreSQL walks
	// the index and stops after n unlocked members instead of sorting
	// every ready member of the pool on each claim (1.2 ms -> 0.13 ms at
	// 1,000 members).
	lock := q.db.dialect.SkipLocked()
	if lock != "" {
		lock = " FOR UPDATE OF i SKIP LOCKED"
	}
	out, err := queryAll(ctx, q, scanInstance, `SELECT `+prefixCols("i.", instanceCols)+` FROM instances i JOIN pools p ON p.id = i.pool_id
		WHERE `+conds+` ORDER BY i.pool_warming_started_at LIMIT ?`+lock, args...)
	if err != nil {
		return nil, fmt.Errorf("claim pool members: %w", q.db.classify(err))
	}
	if len(out) == 0 {
		return nil, store.Errorf(store.ErrNotFound, "ready member in pool %q", poolID)
	}
	return out, nil
}

func (q *queries) ClaimPoolMembers(ctx context.Context, poolID store.PoolID, class string, claims []store.PoolClaim, at time.Time) ([]*store.Instance, error) {
	if len(claims) == 0 {
		return nil, fmt.Errorf("claim pool members: no claims")
	}
	ins, err := q.readyMembers(ctx, poolID, class, len(claims), at)
	if err != nil {
		return nil, err
	}
	// One UPDATE for the lot: each member's own claim fields by CASE on id.
	cases := func(col string, v func(store.PoolClaim) string, args *[]any) string {
		var b strings.Builder
		b.WriteString(col + " = CASE id")
		for i, in := range ins {
			b.WriteString(" WHEN ? THEN ?")
			*args = append(*args, string(in.ID), v(claims[i]))
		}
		b.WriteString(" END")
		return b.String()
	}
	claimed, err := storedPoolState(lifecycle.PoolClaimed)
	if err != nil {
		return nil, fmt.Errorf("claim pool members: %w", err)
	}
	args := []any{claimed, ts(at), ts(at), false, false}
	sets := []string{
		cases("claim_id", func(c store.PoolClaim) string { return string(c.ClaimID) }, &args),
		cases("acquired_by", func(c store.PoolClaim) string { return c.AcquiredBy }, &args),
		cases("acquired_for", func(c store.PoolClaim) string { return c.AcquiredFor }, &args),
	}
	ids := make([]any, len(ins))
	for i, in := range ins {
		ids[i] = string(in.ID)
	}
	args = append(args, ids...)
	res, err := q.exec(ctx, `UPDATE instances SET pool_state = ?, pool_acquired_at = ?, updated_at = ?, claimed_stale_flagged = ?,
		heartbeat_stale_flagged = ?, `+strings.Join(sets, ", ")+` WHERE id `+in(len(ids)), args...)
	if err != nil {
		return nil, fmt.Errorf("claim pool members: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil || int(n) != len(ins) {
		return nil, fmt.Errorf("claim pool members: updated %d of %d locked members (%v)", n, len(ins), err)
	}
	for i, in := range ins {
		c := claims[i]
		t := at
		in.PoolState, in.PoolAcquiredAt, in.UpdatedAt = lifecycle.PoolClaimed, &t, at
		in.ClaimID, in.AcquiredBy, in.AcquiredFor = c.ClaimID, c.AcquiredBy, c.AcquiredFor
		in.ClaimedStaleFlagged, in.HeartbeatStaleFlagged = false, false
	}
	return ins, nil
}

func (q *queries) DeletePoolMember(ctx context.Context, id store.InstanceID) error {
	res, err := q.exec(ctx, `DELETE FROM instances WHERE id = ? AND pool_id IS NOT NULL AND status IN ('terminated', 'error')`, string(id))
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
