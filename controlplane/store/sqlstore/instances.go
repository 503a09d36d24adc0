package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"math/bits"
	"slices"
	"strings"

	"github.com/tetherfleet/tether/controlplane/lifecycle"
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
	in.OperationID, in.PoolID = opID.String, store.PoolID(poolID.String)
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
	return []any{string(in.ID), string(in.NodeID), status, in.Provider, in.Region, in.InstanceType, in.CloudInstanceID, nstr(in.OperationID),
		nstr(string(in.PoolID)), poolState, nts(in.PoolWarmingStartedAt), nts(in.PoolReadyAt), nts(in.PoolAcquiredAt), string(in.ClaimID), in.AcquiredBy, in.AcquiredFor,
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
		in.ID = store.InstanceID(newID())
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

func (q *queries) getInstance(ctx context.Context, suffix string, id store.InstanceID) (*store.Instance, error) {
	in, err := scanInstance(q.row(ctx, `SELECT `+instanceCols+` FROM instances WHERE id = ?`+suffix, string(id)))
	if err != nil {
		return nil, notFound(q.db.classify(err), "instance", id)
	}
	return in, nil
}

func (q *queries) GetInstance(ctx context.Context, id store.InstanceID) (*store.Instance, error) {
	return q.getInstance(ctx, "", id)
}

func (q *queries) InstanceStatus(ctx context.Context, id store.InstanceID) (lifecycle.State, error) {
	var status string
	if err := q.row(ctx, `SELECT status FROM instances WHERE id = ?`, string(id)).Scan(&status); err != nil {
		return "", notFound(q.db.classify(err), "instance", id)
	}
	st, err := parseStoredState(status)
	if err != nil {
		return "", fmt.Errorf("instance %s: %w", id, err)
	}
	return st, nil
}

func (q *queries) InstanceNode(ctx context.Context, id store.InstanceID) (store.NodeID, lifecycle.State, error) {
	var node store.NodeID
	var status string
	if err := q.row(ctx, `SELECT node_id, status FROM instances WHERE id = ?`, string(id)).Scan(&node, &status); err != nil {
		return "", "", notFound(q.db.classify(err), "instance", id)
	}
	st, err := parseStoredState(status)
	if err != nil {
		return "", "", fmt.Errorf("instance %s: %w", id, err)
	}
	return node, st, nil
}

func (q *queries) EnrollGate(ctx context.Context, id store.InstanceID) (store.EnrollGate, error) {
	var g store.EnrollGate
	var status string
	if err := q.row(ctx, `SELECT i.status, n.require_attestation, t.require_attestation FROM instances i
		JOIN nodes n ON n.id = i.node_id JOIN templates t ON t.id = n.template_id WHERE i.id = ?`, string(id)).
		Scan(&status, &g.NodeRequiresAttestation, &g.TemplateRequiresAttestation); err != nil {
		return g, notFound(q.db.classify(err), "instance", id)
	}
	st, err := parseStoredState(status)
	if err != nil {
		return g, fmt.Errorf("instance %s: %w", id, err)
	}
	g.Status = st
	return g, nil
}

func (q *queries) LockInstance(ctx context.Context, id store.InstanceID) (*store.Instance, error) {
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
		conds, args = append(conds, "node_id = ?"), append(args, string(f.NodeID))
	}
	if f.PoolID != "" {
		conds, args = append(conds, "pool_id = ?"), append(args, string(f.PoolID))
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
	if f.UpdatedBefore != nil {
		conds, args = append(conds, "updated_at < ?"), append(args, ts(*f.UpdatedBefore))
	}
	if f.AgentPhase != "" {
		conds, args = append(conds, "agent_phase = ?"), append(args, f.AgentPhase)
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
	upd = append(upd, args[len(args)-1], string(in.ID))
	res, err := q.exec(ctx, instanceUpdate, upd...)
	return mustAffect(res, err, "instance", in.ID)
}

// heartbeatChunk bounds the rows of one heartbeat UPDATE. At 8 parameters
// a row a full chunk binds 4,096, far under SQLite's limit (32,766) and
// PostgreSQL's (65,535), and its text stays 20-30 KB.
const heartbeatChunk = 512

// heartbeatUpdates[k] writes 2^k heartbeats in one statement, k = 0..9.
// A batch is cut into full chunks and then into powers of two (see
// heartbeatChunkSize), so these ten texts are the only ones there are:
// each is prepared once per connection (queries.stmt; pgx's own cache on
// PostgreSQL), not once per batch size.
//
// The rows come in as a VALUES list joined on id (UPDATE ... FROM, SQLite
// 3.33+). SQLite takes no column list on the alias (AS hb(id, ...)), but
// both backends name VALUES columns column1, column2, ..., so the query
// uses those. The time is cast in every row: PostgreSQL would otherwise
// resolve the untyped parameters of a VALUES column to text, and
// "bigint <= text" does not exist (SQLSTATE 42883); on SQLite the cast is
// a no-op.
var heartbeatUpdates = func() [10]string {
	var out [10]string
	for k := range out {
		var b strings.Builder
		// A heartbeat never moves last_heartbeat_at backwards (batches
		// from two replicas may land out of order) and always ends a
		// silence. An id with no instance matches no row and is skipped,
		// as a single-row UPDATE of it would be.
		b.WriteString(`UPDATE instances SET last_heartbeat_at = hb.column2, agent_phase = hb.column3, agent_version = hb.column4,
	running_modules = hb.column5, agent_error = hb.column6, addresses = hb.column7, boot_id = hb.column8,
	silent_since = NULL, heartbeat_stale_flagged = FALSE
FROM (VALUES `)
		for i := 0; i < 1<<k; i++ {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString("(?, CAST(? AS BIGINT), ?, ?, ?, ?, ?, ?)")
		}
		b.WriteString(`) AS hb
WHERE instances.id = hb.column1 AND (instances.last_heartbeat_at IS NULL OR instances.last_heartbeat_at <= hb.column2)`)
		out[k] = b.String()
	}
	return out
}()

// heartbeatChunkSize is how many of n remaining heartbeats the next
// statement writes: a full chunk, else the largest power of two not above
// n. A batch of n takes n/512 statements and one per bit set in n%512: at
// most n/512 + 9.
func heartbeatChunkSize(n int) int {
	if n >= heartbeatChunk {
		return heartbeatChunk
	}
	return 1 << (bits.Len(uint(n)) - 1)
}

// RecordHeartbeats writes hbs with one multi-row UPDATE per chunk, not
// one per heartbeat: at fleet scale the per-statement cost (SQLite
// parsing and planning the same UPDATE again, a PostgreSQL round trip)
// was most of the write.
func (q *queries) RecordHeartbeats(ctx context.Context, hbs []store.Heartbeat) error {
	hbs = newestPerInstance(hbs)
	total := len(hbs)
	for done := 0; done < total; {
		n := heartbeatChunkSize(total - done)
		chunk := hbs[done : done+n]
		args := make([]any, 0, 8*n)
		for _, hb := range chunk {
			args = append(args, string(hb.InstanceID), ts(hb.At), hb.Phase, hb.AgentVersion, jsonList(hb.RunningModules),
				hb.AgentError, jsonList(hb.Addresses), hb.BootID)
		}
		if _, err := q.exec(ctx, heartbeatUpdates[bits.Len(uint(n))-1], args...); err != nil {
			return fmt.Errorf("record heartbeats %d-%d of %d (first %s): %w", done+1, done+n, total, chunk[0].InstanceID, err)
		}
		done += n
	}
	return nil
}

// newestPerInstance returns hbs with one heartbeat per instance, sorted by
// id. The hub keys its batch by instance, but a join with two rows for
// one target row would update it from either, unpredictably; this keeps
// what writing them one by one in order would have left: the newest, and
// of equal times the later. Sorting gives concurrent writers (replicas
// flushing overlapping batches) one row order to lock in.
func newestPerInstance(hbs []store.Heartbeat) []store.Heartbeat {
	out := slices.Clone(hbs)
	slices.SortStableFunc(out, func(a, b store.Heartbeat) int { return strings.Compare(string(a.InstanceID), string(b.InstanceID)) })
	keep := out[:0]
	for _, hb := range out {
		if n := len(keep); n > 0 && keep[n-1].InstanceID == hb.InstanceID {
			if !hb.At.Before(keep[n-1].At) {
				keep[n-1] = hb
			}
			continue
		}
		keep = append(keep, hb)
	}
	return keep
}
