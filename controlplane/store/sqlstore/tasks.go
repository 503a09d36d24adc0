package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
)

const taskCols = `id, target, instance_id, kind, payload, status, lease_owner, lease_expires_at, attempts, max_attempts,
	exit_code, output, output_truncated, error_message, progress, cancel_requested, created_at, updated_at`

func scanTask(s scanner) (*store.Task, error) {
	var t store.Task
	var payload, target, kind, status string
	var lease, exit sql.NullInt64
	var created, updated int64
	if err := s.Scan(&t.ID, &target, &t.InstanceID, &kind, &payload, &status, &t.LeaseOwner, &lease, &t.Attempts, &t.MaxAttempts,
		&exit, &t.Output, &t.OutputTruncated, &t.ErrorMessage, &t.Progress, &t.CancelRequested, &created, &updated); err != nil {
		return nil, err
	}
	var err error
	if t.Target, err = parseStoredTaskTarget(target); err != nil {
		return nil, fmt.Errorf("task %s: %w", t.ID, err)
	}
	if t.Status, err = parseStoredTaskStatus(status); err != nil {
		return nil, fmt.Errorf("task %s: %w", t.ID, err)
	}
	t.Kind = store.TaskKind(kind)
	t.Payload = []byte(payload)
	t.LeaseExpiresAt = fromNTS(lease)
	if exit.Valid {
		v := int(exit.Int64)
		t.ExitCode = &v
	}
	t.CreatedAt, t.UpdatedAt = fromTS(created), fromTS(updated)
	return &t, nil
}

func taskArgs(t *store.Task) ([]any, error) {
	target, err := storedTaskTarget(t.Target)
	if err != nil {
		return nil, fmt.Errorf("task %s: %w", t.ID, err)
	}
	status, err := storedTaskStatus(t.Status)
	if err != nil {
		return nil, fmt.Errorf("task %s: %w", t.ID, err)
	}
	var exit any
	if t.ExitCode != nil {
		exit = *t.ExitCode
	}
	out := t.Output
	if out == nil {
		out = []byte{}
	}
	return []any{string(t.ID), target, string(t.InstanceID), string(t.Kind), jsonObject(t.Payload), status, t.LeaseOwner, nts(t.LeaseExpiresAt), t.Attempts, t.MaxAttempts,
		exit, out, t.OutputTruncated, t.ErrorMessage, t.Progress, t.CancelRequested, ts(t.CreatedAt), ts(t.UpdatedAt)}, nil
}

func (q *queries) CreateTask(ctx context.Context, t *store.Task) error {
	if t.ID == "" {
		t.ID = store.TaskID(newID())
	}
	args, err := taskArgs(t)
	if err != nil {
		return fmt.Errorf("create task: %w", err)
	}
	if _, err := q.exec(ctx, `INSERT INTO tasks (`+taskCols+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`, args...); err != nil {
		return fmt.Errorf("create task: %w", err)
	}
	return nil
}

func (q *queries) getTask(ctx context.Context, suffix string, id store.TaskID) (*store.Task, error) {
	t, err := scanTask(q.row(ctx, `SELECT `+taskCols+` FROM tasks WHERE id = ?`+suffix, string(id)))
	if err != nil {
		return nil, notFound(q.db.classify(err), "task", id.String())
	}
	return t, nil
}

func (q *queries) GetTask(ctx context.Context, id store.TaskID) (*store.Task, error) {
	return q.getTask(ctx, "", id)
}

func (q *queries) LockTask(ctx context.Context, id store.TaskID) (*store.Task, error) {
	return q.getTask(ctx, q.db.dialect.LockRow(), id)
}

func (q *queries) ListTasks(ctx context.Context, f store.TaskFilter, p store.Page) ([]*store.Task, error) {
	p = p.Normalize()
	conds, args := []string{"id > ?"}, []any{p.After}
	if f.InstanceID != "" {
		conds, args = append(conds, "instance_id = ?"), append(args, string(f.InstanceID))
	}
	if f.Target != "" {
		conds, args = append(conds, "target = ?"), append(args, string(f.Target))
	}
	if len(f.Statuses) > 0 {
		conds, args = append(conds, "status "+in(len(f.Statuses))), append(args, anySlice(f.Statuses)...)
	}
	rows, err := q.query(ctx, `SELECT `+taskCols+` FROM tasks WHERE `+strings.Join(conds, " AND ")+` ORDER BY id LIMIT ?`, append(args, p.Limit)...)
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	out, err := collect(q, rows, scanTask)
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	return out, nil
}

func (q *queries) UpdateTask(ctx context.Context, t *store.Task) error {
	args, err := taskArgs(t)
	if err != nil {
		return fmt.Errorf("update task: %w", err)
	}
	res, err := q.exec(ctx, `UPDATE tasks SET target = ?, instance_id = ?, kind = ?, payload = ?, status = ?, lease_owner = ?, lease_expires_at = ?,
		attempts = ?, max_attempts = ?, exit_code = ?, output = ?, output_truncated = ?, error_message = ?, progress = ?, cancel_requested = ?,
		updated_at = ? WHERE id = ?`, append(append(args[1:16:16], args[17]), string(t.ID))...)
	return mustAffect(res, err, "task", t.ID)
}

func (q *queries) ClaimTask(ctx context.Context, c store.TaskClaim) (*store.Task, error) {
	conds, args := []string{"status = 'pending'", "target = ?"}, []any{string(c.Target)}
	if c.InstanceID != "" {
		conds, args = append(conds, "instance_id = ?"), append(args, string(c.InstanceID))
	}
	if c.TaskID != "" {
		conds, args = append(conds, "id = ?"), append(args, string(c.TaskID))
	}
	// The inner SELECT locks the row it picks (SKIP LOCKED on PostgreSQL,
	// so a concurrent claimer moves on to the next task); the outer UPDATE
	// re-checks the status, so even without row locks two claimers cannot
	// both win.
	pick := `SELECT id FROM tasks WHERE ` + strings.Join(conds, " AND ") + ` ORDER BY created_at, id LIMIT 1` + q.db.dialect.SkipLocked()
	t, err := scanTask(q.row(ctx, `UPDATE tasks SET status = 'leased', lease_owner = ?, lease_expires_at = ?, updated_at = ?
		WHERE id = (`+pick+`) AND status = 'pending' RETURNING `+taskCols,
		append([]any{c.Owner, ts(c.LeaseUntil), ts(c.Now)}, args...)...))
	if err != nil {
		return nil, notFound(q.db.classify(err), "pending task for", string(c.Target)+"/"+c.InstanceID.String()+c.TaskID.String())
	}
	return t, nil
}

func (q *queries) ExpireTaskLeases(ctx context.Context, now time.Time) ([]*store.Task, error) {
	rows, err := q.query(ctx, `SELECT `+taskCols+` FROM tasks WHERE status IN ('leased', 'running') AND lease_expires_at < ? ORDER BY id`+q.db.dialect.SkipLocked(), ts(now))
	if err != nil {
		return nil, fmt.Errorf("expire task leases: %w", err)
	}
	expired, err := collect(q, rows, scanTask)
	if err != nil {
		return nil, fmt.Errorf("expire task leases: %w", err)
	}
	for _, t := range expired {
		t.Attempts++
		t.LeaseOwner, t.LeaseExpiresAt, t.UpdatedAt = "", nil, now
		switch {
		case t.CancelRequested:
			t.Status, t.ErrorMessage = store.TaskCancelled, "cancelled; the lease expired before the executor confirmed"
		case t.Attempts >= t.MaxAttempts:
			t.Status = store.TaskFailed
			t.ErrorMessage = fmt.Sprintf("lease expired on attempt %d of %d; giving up", t.Attempts, t.MaxAttempts)
		default:
			t.Status = store.TaskPending
			t.ErrorMessage = fmt.Sprintf("lease expired on attempt %d of %d; retrying", t.Attempts, t.MaxAttempts)
		}
		if err := q.UpdateTask(ctx, t); err != nil {
			return nil, err
		}
	}
	return expired, nil
}

// agentWork's arms each seek tasks_claim (status, target, instance_id).
// The pending arm stops at its first row: one is enough to say so.
var agentWork = `SELECT ` + taskCols + ` FROM (SELECT ` + taskCols + ` FROM tasks WHERE status = 'pending' AND target = ? AND instance_id = ? LIMIT 1) AS p
	UNION ALL SELECT ` + taskCols + ` FROM tasks WHERE status = 'leased' AND target = ? AND instance_id = ? AND cancel_requested = ?
	UNION ALL SELECT ` + taskCols + ` FROM tasks WHERE status = 'running' AND target = ? AND instance_id = ? AND cancel_requested = ?`

func (q *queries) AgentWork(ctx context.Context, instanceID store.InstanceID) (bool, []*store.Task, error) {
	a := store.TaskTargetAgent
	id := string(instanceID)
	rows, err := q.query(ctx, agentWork, a, id, a, id, true, a, id, true)
	if err != nil {
		return false, nil, fmt.Errorf("agent work of %s: %w", instanceID, err)
	}
	ts, err := collect(q, rows, scanTask)
	if err != nil {
		return false, nil, fmt.Errorf("agent work of %s: %w", instanceID, err)
	}
	pending := false
	var cancels []*store.Task
	for _, t := range ts {
		if t.Status == store.TaskPending {
			pending = true
		} else {
			cancels = append(cancels, t)
		}
	}
	return pending, cancels, nil
}

func (q *queries) ListInstancesWithAgentWork(ctx context.Context) ([]store.InstanceID, error) {
	rows, err := q.query(ctx, `SELECT DISTINCT instance_id FROM tasks WHERE target = ?
		AND (status = 'pending' OR (status IN ('leased', 'running') AND cancel_requested = ?))`, string(store.TaskTargetAgent), true)
	if err != nil {
		return nil, fmt.Errorf("list instances with agent work: %w", err)
	}
	ids, err := collect(q, rows, func(s scanner) (store.InstanceID, error) {
		var id store.InstanceID
		return id, s.Scan(&id)
	})
	if err != nil {
		return nil, fmt.Errorf("list instances with agent work: %w", err)
	}
	return ids, nil
}
