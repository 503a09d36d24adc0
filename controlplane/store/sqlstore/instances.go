package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/tetherfleet/tether/controlplane/store"
)

const instanceCols = `id, node_id, status, provider, region, instance_type, cloud_instance_id, operation_id,
	pool_id, pool_state, pool_warming_started_at, pool_ready_at, pool_acquired_at, claim_id, acquired_by, acquired_for,
	pool_terminate_attempts, pool_next_terminate_at, claimed_stale_flagged, heartbeat_stale_flagged,
	hold, hold_reason, cordon_by, cordon_reason, cordon_at, cordon_pool_state_before,
	last_heartbeat_at, agent_phase, agent_version, running_modules, agent_error, addresses, boot_id, silent_since,
	error_message, terminate_requested_at, created_at, updated_at`

const instanceColCount = 38

func scanInstance(s scanner) (*store.Instance, error) {
	var in store.Instance
	var opID, poolID sql.NullString
	var warming, ready, acquired, nextTerm, cordonAt, hb, silent, termReq sql.NullInt64
	var cordonBy, cordonReason, cordonBefore sql.NullString
	var status, poolState, modules, addrs string
	var created, updated int64
	err := s.Scan(&in.ID, &in.NodeID, &status, &in.Provider, &in.Region, &in.InstanceType, &in.CloudInstanceID, &opID,
		&poolID, &poolState, &warming, &ready, &acquired, &in.ClaimID, &in.AcquiredBy, &in.AcquiredFor,
		&in.PoolTerminateAttempts, &nextTerm, &in.ClaimedStaleFlagged, &in.HeartbeatStaleFlagged,
		&in.Hold, &in.HoldReason, &cordonBy, &cordonReason, &cordonAt, &cordonBefore,
		&hb, &in.AgentPhase, &in.AgentVersion, &modules, &in.AgentError, &addrs, &in.BootID, &silent,
		&in.ErrorMessage, &termReq, &created, &updated)
	if err != nil {
		return nil, err
	}
	if in.Status, err = parseStoredState(status); err != nil {
		return nil, fmt.Errorf("instance %s: %w", in.ID, err)
	}
	if in.PoolState, err = parseStoredPoolState(poolState); err != nil {
		return nil, fmt.Errorf("instance %s: %w", in.ID, err)
	}
	in.OperationID, in.PoolID = opID.String, poolID.String
	in.PoolWarmingStartedAt, in.PoolReadyAt, in.PoolAcquiredAt = fromNTS(warming), fromNTS(ready), fromNTS(acquired)
	in.PoolNextTerminateAt = fromNTS(nextTerm)
	if cordonAt.Valid {
		before, err := parseStoredPoolState(cordonBefore.String)
		if err != nil {
			return nil, fmt.Errorf("instance %s cordon: %w", in.ID, err)
		}
		in.Cordon = &store.Cordon{By: cordonBy.String, Reason: cordonReason.String, At: fromTS(cordonAt.Int64), PoolStateBefore: before}
	}
	in.LastHeartbeatAt, in.SilentSince, in.TerminateRequestedAt = fromNTS(hb), fromNTS(silent), fromNTS(termReq)
	if in.RunningModules, err = parseList("running_modules", modules); err != nil {
		return nil, fmt.Errorf("instance %s: %w", in.ID, err)
	}
	if in.Addresses, err = parseList("addresses", addrs); err != nil {
		return nil, fmt.Errorf("instance %s: %w", in.ID, err)
	}
	in.CreatedAt, in.UpdatedAt = fromTS(created), fromTS(updated)
	return &in, nil
}

func instanceArgs(in *store.Instance) ([]any, error) {
	var cordonBy, cordonReason, cordonBefore any
	var cordonAt any
	if c := in.Cordon; c != nil {
		before, err := storedPoolState(c.PoolStateBefore)
		if err != nil {
			return nil, fmt.Errorf("instance %s cordon: %w", in.ID, err)
		}
		cordonBy, cordonReason, cordonAt, cordonBefore = c.By, c.Reason, ts(c.At), before
	}
	status, err := storedState(in.Status)
	if err != nil {
		return nil, fmt.Errorf("instance %s: %w", in.ID, err)
	}
	poolState, err := storedPoolState(in.PoolState)
	if err != nil {
		return nil, fmt.Errorf("instance %s: %w", in.ID, err)
	}
	return []any{in.ID, in.NodeID, status, in.Provider, in.Region, in.InstanceType, in.CloudInstanceID, nstr(in.OperationID),
		nstr(in.PoolID), poolState, nts(in.PoolWarmingStartedAt), nts(in.PoolReadyAt), nts(in.PoolAcquiredAt), in.ClaimID, in.AcquiredBy, in.AcquiredFor,
		in.PoolTerminateAttempts, nts(in.PoolNextTerminateAt), in.ClaimedStaleFlagged, in.HeartbeatStaleFlagged,
		in.Hold, in.HoldReason, cordonBy, cordonReason, cordonAt, cordonBefore,
		nts(in.LastHeartbeatAt), in.AgentPhase, in.AgentVersion, jsonList(in.RunningModules), in.AgentError, jsonList(in.Addresses), in.BootID, nts(in.SilentSince),
		in.ErrorMessage, nts(in.TerminateRequestedAt), ts(in.CreatedAt), ts(in.UpdatedAt)}, nil
}

var instanceInsert = `INSERT INTO instances (` + instanceCols + `) VALUES (` + strings.TrimSuffix(strings.Repeat("?,", instanceColCount), ",") + `)`

var instanceUpdate = func() string {
	cols := strings.Split(instanceCols, ",")
	var sets []string
	for _, c := range cols[1:] { // every column but id
		c = strings.TrimSpace(c)
		if c == "created_at" {
			continue
		}
		sets = append(sets, c+" = ?")
	}
	return `UPDATE instances SET ` + strings.Join(sets, ", ") + ` WHERE id = ?`
}()

func (q *queries) CreateInstance(ctx context.Context, in *store.Instance) error {
	if in.ID == "" {
		in.ID = newID()
	}
	args, err := instanceArgs(in)
	if err != nil {
		return fmt.Errorf("create instance: %w", err)
	}
	if _, err := q.exec(ctx, instanceInsert, args...); err != nil {
		return fmt.Errorf("create instance: %w", err)
	}
	return nil
}

func (q *queries) getInstance(ctx context.Context, suffix, id string) (*store.Instance, error) {
	in, err := scanInstance(q.row(ctx, `SELECT `+instanceCols+` FROM instances WHERE id = ?`+suffix, id))
	if err != nil {
		return nil, notFound(q.db.classify(err), "instance", id)
	}
	return in, nil
}

func (q *queries) GetInstance(ctx context.Context, id string) (*store.Instance, error) {
	return q.getInstance(ctx, "", id)
}

func (q *queries) LockInstance(ctx context.Context, id string) (*store.Instance, error) {
	return q.getInstance(ctx, q.db.dialect.LockRow(), id)
}

func (q *queries) GetInstanceByOperationID(ctx context.Context, operationID string) (*store.Instance, error) {
	in, err := scanInstance(q.row(ctx, `SELECT `+instanceCols+` FROM instances WHERE operation_id = ?`, operationID))
	if err != nil {
		return nil, notFound(q.db.classify(err), "instance with operation id", operationID)
	}
	return in, nil
}

func instanceWhere(f store.InstanceFilter) (string, []any, error) {
	conds := []string{"1 = 1"}
	var args []any
	if f.NodeID != "" {
		conds, args = append(conds, "node_id = ?"), append(args, f.NodeID)
	}
	if f.PoolID != "" {
		conds, args = append(conds, "pool_id = ?"), append(args, f.PoolID)
	}
	if f.Provider != "" {
		conds, args = append(conds, "provider = ?"), append(args, f.Provider)
	}
	if len(f.Statuses) > 0 {
		names, err := storedStates(f.Statuses, storedState)
		if err != nil {
			return "", nil, err
		}
		conds, args = append(conds, "status "+in(len(names))), append(args, names...)
	}
	if len(f.PoolStates) > 0 {
		names, err := storedStates(f.PoolStates, storedPoolState)
		if err != nil {
			return "", nil, err
		}
		conds, args = append(conds, "pool_state "+in(len(names))), append(args, names...)
	}
	if f.HeartbeatBefore != nil {
		conds, args = append(conds, "COALESCE(last_heartbeat_at, created_at) < ?"), append(args, ts(*f.HeartbeatBefore))
	}
	if f.TerminateRequested {
		conds = append(conds, "terminate_requested_at IS NOT NULL")
	}
	return strings.Join(conds, " AND "), args, nil
}

func (q *queries) ListInstances(ctx context.Context, f store.InstanceFilter, p store.Page) ([]*store.Instance, error) {
	p = p.Normalize()
	where, args, err := instanceWhere(f)
	if err != nil {
		return nil, fmt.Errorf("list instances: %w", err)
	}
	order := "id"
	if f.OldestFirst {
		order = "created_at, id"
	}
	where += " AND id > ?"
	args = append(args, p.After, p.Limit)
	rows, err := q.query(ctx, `SELECT `+instanceCols+` FROM instances WHERE `+where+` ORDER BY `+order+` LIMIT ?`, args...)
	if err != nil {
		return nil, fmt.Errorf("list instances: %w", err)
	}
	out, err := collect(q, rows, scanInstance)
	if err != nil {
		return nil, fmt.Errorf("list instances: %w", err)
	}
	return out, nil
}

func (q *queries) CountInstances(ctx context.Context, f store.InstanceFilter) (int, error) {
	where, args, err := instanceWhere(f)
	if err != nil {
		return 0, fmt.Errorf("count instances: %w", err)
	}
	var n int
	if err := q.row(ctx, `SELECT COUNT(*) FROM instances WHERE `+where, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count instances: %w", q.db.classify(err))
	}
	return n, nil
}

func (q *queries) UpdateInstance(ctx context.Context, in *store.Instance) error {
	args, err := instanceArgs(in)
	if err != nil {
		return fmt.Errorf("update instance: %w", err)
	}
	// instanceArgs is in column order: drop id (first) and created_at
	// (second to last), then key the WHERE on id.
	upd := make([]any, 0, len(args))
	upd = append(upd, args[1:len(args)-2]...)
	upd = append(upd, args[len(args)-1], in.ID)
	res, err := q.exec(ctx, instanceUpdate, upd...)
	return mustAffect(res, err, "instance", in.ID)
}

func (q *queries) RecordHeartbeats(ctx context.Context, hbs []store.Heartbeat) error {
	for _, hb := range hbs {
		// A heartbeat never moves last_heartbeat_at backwards (batches from
		// two replicas may land out of order) and always ends a silence.
		_, err := q.exec(ctx, `UPDATE instances SET last_heartbeat_at = ?, agent_phase = ?, agent_version = ?, running_modules = ?,
			agent_error = ?, addresses = ?, boot_id = ?, silent_since = NULL, heartbeat_stale_flagged = ?
			WHERE id = ? AND (last_heartbeat_at IS NULL OR last_heartbeat_at <= ?)`,
			ts(hb.At), hb.Phase, hb.AgentVersion, jsonList(hb.RunningModules), hb.AgentError, jsonList(hb.Addresses), hb.BootID, false,
			hb.InstanceID, ts(hb.At))
		if err != nil {
			return fmt.Errorf("record heartbeat of %s: %w", hb.InstanceID, err)
		}
	}
	return nil
}
