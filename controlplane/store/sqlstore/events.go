package sqlstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
)

const eventCols = `id, kind, severity, instance_id, pool_id, correlation_id, message, payload, created_at`

func scanEvent(s scanner) (*store.Event, error) {
	var e store.Event
	var payload string
	var created int64
	if err := s.Scan(&e.ID, &e.Kind, &e.Severity, &e.InstanceID, &e.PoolID, &e.CorrelationID, &e.Message, &payload, &created); err != nil {
		return nil, err
	}
	e.Payload, e.CreatedAt = []byte(payload), fromTS(created)
	return &e, nil
}

func (q *queries) AppendEvent(ctx context.Context, e *store.Event) error {
	if es, ok := q.db.dialect.(EventSerializer); ok {
		if !q.inTx {
			// The serialising lock lasts until the transaction ends, so an
			// autocommit append needs a transaction of its own.
			return q.db.Tx(ctx, func(tq store.Queries) error { return tq.AppendEvent(ctx, e) })
		}
		if _, err := q.exec(ctx, es.SerializeEvents()); err != nil {
			return fmt.Errorf("append event %s: %w", e.Kind, err)
		}
	}
	err := q.row(ctx, `INSERT INTO events (kind, severity, instance_id, pool_id, correlation_id, message, payload, created_at)
		VALUES (?,?,?,?,?,?,?,?) RETURNING id`,
		e.Kind, e.Severity, e.InstanceID, e.PoolID, e.CorrelationID, e.Message, jsonObject(e.Payload), ts(e.CreatedAt)).Scan(&e.ID)
	if err != nil {
		return fmt.Errorf("append event %s: %w", e.Kind, q.db.classify(err))
	}
	return q.Notify(ctx, store.ChannelEvents, strconv.FormatInt(e.ID, 10))
}

func (q *queries) AppendEvents(ctx context.Context, es []*store.Event) error {
	if len(es) == 0 {
		return nil
	}
	if ser, ok := q.db.dialect.(EventSerializer); ok {
		if !q.inTx {
			return q.db.Tx(ctx, func(tq store.Queries) error { return tq.AppendEvents(ctx, es) })
		}
		// The lock is held to the end of the transaction: once is enough.
		if _, err := q.exec(ctx, ser.SerializeEvents()); err != nil {
			return fmt.Errorf("append %d events: %w", len(es), err)
		}
	}
	// One multi-row INSERT. Both backends draw the ids of one statement in
	// VALUES order (a sequence's nextval per row; SQLite's rowid), while
	// the order RETURNING lists them in is not promised: sorted, the ids
	// map back onto es in order.
	const cols = 8
	args := make([]any, 0, cols*len(es))
	rows := make([]string, len(es))
	for i, e := range es {
		rows[i] = "(?,?,?,?,?,?,?,?)"
		args = append(args, e.Kind, e.Severity, e.InstanceID, e.PoolID, e.CorrelationID, e.Message, jsonObject(e.Payload), ts(e.CreatedAt))
	}
	res, err := q.query(ctx, `INSERT INTO events (kind, severity, instance_id, pool_id, correlation_id, message, payload, created_at)
		VALUES `+strings.Join(rows, ",")+` RETURNING id`, args...)
	if err != nil {
		return fmt.Errorf("append %d events: %w", len(es), err)
	}
	ids, err := collect(q, res, func(s scanner) (int64, error) { var id int64; return id, s.Scan(&id) })
	if err != nil {
		return fmt.Errorf("append %d events: %w", len(es), q.db.classify(err))
	}
	if len(ids) != len(es) {
		return fmt.Errorf("append %d events: %d ids returned", len(es), len(ids))
	}
	slices.Sort(ids)
	for i, e := range es {
		e.ID = ids[i]
	}
	// Watchers re-read everything after the id they last saw, so the last
	// id stands for the whole batch.
	return q.Notify(ctx, store.ChannelEvents, strconv.FormatInt(es[len(es)-1].ID, 10))
}

func eventWhere(f store.EventFilter) ([]string, []any) {
	var conds []string
	var args []any
	if f.Kind != "" {
		conds, args = append(conds, "kind = ?"), append(args, f.Kind)
	}
	if f.InstanceID != "" {
		conds, args = append(conds, "instance_id = ?"), append(args, f.InstanceID)
	}
	if f.PoolID != "" {
		conds, args = append(conds, "pool_id = ?"), append(args, f.PoolID)
	}
	if f.CorrelationID != "" {
		conds, args = append(conds, "correlation_id = ?"), append(args, f.CorrelationID)
	}
	if f.MinSeverity > 0 {
		conds, args = append(conds, "severity >= ?"), append(args, f.MinSeverity)
	}
	return conds, args
}

func (q *queries) ListEvents(ctx context.Context, f store.EventFilter, p store.Page) ([]*store.Event, error) {
	p = p.Normalize()
	conds, args := eventWhere(f)
	if p.After != "" {
		before, err := strconv.ParseInt(p.After, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("list events: bad page token: %w", err)
		}
		conds, args = append(conds, "id < ?"), append(args, before)
	}
	where := ""
	if len(conds) > 0 {
		where = " WHERE " + strings.Join(conds, " AND ")
	}
	rows, err := q.query(ctx, `SELECT `+eventCols+` FROM events`+where+` ORDER BY id DESC LIMIT ?`, append(args, p.Limit)...)
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	out, err := collect(q, rows, scanEvent)
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	return out, nil
}

func (q *queries) ListEventsSince(ctx context.Context, f store.EventFilter, afterID int64, limit int) ([]*store.Event, error) {
	conds, args := eventWhere(f)
	conds, args = append(conds, "id > ?"), append(args, afterID)
	if limit <= 0 || limit > store.MaxPageSize {
		limit = store.MaxPageSize
	}
	rows, err := q.query(ctx, `SELECT `+eventCols+` FROM events WHERE `+strings.Join(conds, " AND ")+` ORDER BY id LIMIT ?`, append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("list events since %d: %w", afterID, err)
	}
	out, err := collect(q, rows, scanEvent)
	if err != nil {
		return nil, fmt.Errorf("list events since %d: %w", afterID, err)
	}
	return out, nil
}

func (q *queries) LatestEventID(ctx context.Context) (int64, error) {
	var id int64
	if err := q.row(ctx, `SELECT COALESCE(MAX(id), 0) FROM events`).Scan(&id); err != nil {
		return 0, fmt.Errorf("latest event id: %w", q.db.classify(err))
	}
	return id, nil
}

func (q *queries) PruneEvents(ctx context.Context, lowBefore, highBefore time.Time) (int64, error) {
	res, err := q.exec(ctx, `DELETE FROM events WHERE (severity < ? AND created_at < ?) OR (severity >= ? AND created_at < ?)`,
		store.SeverityHigh, ts(lowBefore), store.SeverityHigh, ts(highBefore))
	if err != nil {
		return 0, fmt.Errorf("prune events: %w", err)
	}
	return res.RowsAffected()
}
