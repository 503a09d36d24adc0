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
	var kind, payload string
	var severity, created int64
	if err := s.Scan(&e.ID, &kind, &severity, &e.InstanceID, &e.PoolID, &e.CorrelationID, &e.Message, &payload, &created); err != nil {
		return nil, err
	}
	e.Kind, e.Severity = store.EventKind(kind), store.Severity(severity)
	e.Payload, e.CreatedAt = []byte(payload), fromTS(created)
	return &e, nil
}

// AppendEvent and AppendEvents write at once where event writers need no
// lock (SQLite serialises all writers anyway). Where they do (PostgreSQL),
// a transaction's events wait in q.pending and are written at commit by
// flushEvents, so the serialising lock is the last one the transaction
// takes. Their ids are assigned then: set once Tx has returned.
func (q *queries) AppendEvent(ctx context.Context, e *store.Event) error {
	return q.AppendEvents(ctx, []*store.Event{e})
}

func (q *queries) AppendEvents(ctx context.Context, es []*store.Event) error {
	if len(es) == 0 {
		return nil
	}
	if _, ok := q.db.dialect.(EventSerializer); ok {
		return q.deferEvents(ctx, es)
	}
	if err := q.insertEvents(ctx, es); err != nil {
		return err
	}
	return q.Notify(ctx, store.ChannelEvents, strconv.FormatInt(es[len(es)-1].ID, 10))
}

// deferEvents queues es for flushEvents. An autocommit append gets a
// transaction of its own: the serialising lock lasts until the
// transaction ends.
func (q *queries) deferEvents(ctx context.Context, es []*store.Event) error {
	if !q.inTx {
		return q.db.Tx(ctx, func(tq store.Queries) error { return tq.AppendEvents(ctx, es) })
	}
	q.pending = append(q.pending, es...)
	return nil
}

// flushEvents writes the events a transaction queued, just before it
// commits. It takes the event writers' lock (EventSerializer) here rather
// than at the first append: a transaction that took it early and then
// waited for a row lock held by a second transaction, itself waiting for
// this lock to append, deadlocked (40P01), and PostgreSQL aborted one of
// them, or any third writer queued on the lock. Taken last, the lock's
// holder has no row left to wait for: the INSERT into events has no
// foreign key, and the sequence does not block.
//
// The lock, the INSERT and the notification are one statement, one round
// trip: as three, they were a third of a pool claim's nine, each waiting
// for a core on a busy machine (docs/benchmarks-pools.md).
func (q *queries) flushEvents(ctx context.Context) error {
	if len(q.pending) == 0 {
		return nil
	}
	es := q.pending
	q.pending = nil
	last := es[len(es)-1]
	ser := q.db.dialect.(EventSerializer) // deferEvents queues only for one
	sn, inStatement := q.db.notifier.(StatementNotifier)
	for len(es) > 0 {
		chunk := es[:min(len(es), maxEventsPerInsert)]
		es = es[len(chunk):]
		// The lock's CTE is materialised and joined to the rows, so it is
		// held before the INSERT draws the first id; taken again by a
		// later chunk, it is the same transaction-long hold.
		values, args := eventValues(chunk, "(?, CAST(? AS INTEGER), ?, ?, ?, ?, ?, CAST(? AS BIGINT))")
		stmt := `WITH serialized AS MATERIALIZED (` + ser.SerializeEvents() + `),
		inserted AS (INSERT INTO events (` + eventInsertCols + `)
			SELECT v.* FROM serialized, (VALUES ` + values + `) AS v(` + eventInsertCols + `) RETURNING id)
		SELECT inserted.id FROM inserted`
		if inStatement && len(es) == 0 {
			// Watchers re-read everything after the id they last saw, so
			// the last id stands for the whole transaction.
			stmt += `, (SELECT ` + sn.NotifyCall("?", "CAST(max(id) AS TEXT)") + ` FROM inserted) AS notified`
			args = append(args, store.ChannelEvents)
		}
		if err := q.assignIDs(ctx, chunk, stmt, args); err != nil {
			return err
		}
	}
	if inStatement {
		return nil
	}
	return q.Notify(ctx, store.ChannelEvents, strconv.FormatInt(last.ID, 10))
}

// maxEventsPerInsert keeps one INSERT's parameters (8 a row) well under
// PostgreSQL's limit of 65535.
const maxEventsPerInsert = 1000

// eventInsertCols are the columns an append writes (the id is drawn).
const eventInsertCols = `kind, severity, instance_id, pool_id, correlation_id, message, payload, created_at`

// eventValues returns the VALUES rows for es, each written as row, and
// their arguments.
func eventValues(es []*store.Event, row string) (string, []any) {
	const cols = 8
	args := make([]any, 0, cols*len(es))
	rows := make([]string, len(es))
	for i, e := range es {
		rows[i] = row
		args = append(args, string(e.Kind), int(e.Severity), string(e.InstanceID), string(e.PoolID), string(e.CorrelationID), e.Message, jsonObject(e.Payload), ts(e.CreatedAt))
	}
	return strings.Join(rows, ","), args
}

// insertEvents writes es in multi-row INSERTs and sets their ids. Chunks
// run one after the other in one transaction, so ids rise across them.
func (q *queries) insertEvents(ctx context.Context, es []*store.Event) error {
	for len(es) > 0 {
		chunk := es[:min(len(es), maxEventsPerInsert)]
		es = es[len(chunk):]
		values, args := eventValues(chunk, "(?,?,?,?,?,?,?,?)")
		if err := q.assignIDs(ctx, chunk, `INSERT INTO events (`+eventInsertCols+`) VALUES `+values+` RETURNING id`, args); err != nil {
			return err
		}
	}
	return nil
}

// assignIDs runs stmt, which inserts chunk and returns the ids drawn, and
// sets them. Both backends draw the ids of one statement in VALUES order
// (a sequence's nextval per row; SQLite's rowid), while the order the ids
// come back in is not promised: sorted, they map back onto chunk in order.
func (q *queries) assignIDs(ctx context.Context, chunk []*store.Event, stmt string, args []any) error {
	res, err := q.query(ctx, stmt, args...)
	if err != nil {
		return fmt.Errorf("append %s: %w", eventKinds(chunk), q.db.classify(err))
	}
	ids, err := collect(q, res, func(s scanner) (int64, error) { var id int64; return id, s.Scan(&id) })
	if err != nil {
		return fmt.Errorf("append %s: %w", eventKinds(chunk), q.db.classify(err))
	}
	if len(ids) != len(chunk) {
		return fmt.Errorf("append %s: %d ids returned", eventKinds(chunk), len(ids))
	}
	slices.Sort(ids)
	for i, e := range chunk {
		e.ID = ids[i]
	}
	return nil
}

// eventKinds names events for an error: "event instance.running" or
// "3 events (instance.transition, ...)".
func eventKinds(es []*store.Event) string {
	if len(es) == 1 {
		return "event " + es[0].Kind.String()
	}
	return fmt.Sprintf("%d events (%s, ...)", len(es), es[0].Kind)
}

func eventWhere(f store.EventFilter) ([]string, []any) {
	var conds []string
	var args []any
	if f.Kind != "" {
		conds, args = append(conds, "kind = ?"), append(args, string(f.Kind))
	}
	if f.InstanceID != "" {
		conds, args = append(conds, "instance_id = ?"), append(args, string(f.InstanceID))
	}
	if f.PoolID != "" {
		conds, args = append(conds, "pool_id = ?"), append(args, string(f.PoolID))
	}
	if f.CorrelationID != "" {
		conds, args = append(conds, "correlation_id = ?"), append(args, string(f.CorrelationID))
	}
	if f.MinSeverity > 0 {
		conds, args = append(conds, "severity >= ?"), append(args, int(f.MinSeverity))
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
	if _, ok := q.db.dialect.(EventSerializer); ok {
		// Past the horizon an id may still be in flight, and a reader that
		// moved beyond it would never come back for it.
		h, err := q.eventHorizon(ctx)
		if err != nil {
			return nil, fmt.Errorf("list events since %d: %w", afterID, err)
		}
		if h <= afterID {
			return nil, nil
		}
		conds, args = append(conds, "id <= ?"), append(args, h)
	}
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

// eventHorizon is EventSerializer.EventHorizon's answer.
func (q *queries) eventHorizon(ctx context.Context) (int64, error) {
	var h int64
	if err := q.row(ctx, q.db.dialect.(EventSerializer).EventHorizon()).Scan(&h); err != nil {
		return 0, fmt.Errorf("event horizon: %w", q.db.classify(err))
	}
	return h, nil
}

// LatestEventID is where a watcher of new events starts. Where ids can
// become visible out of order it is the horizon, not the highest visible
// id: an event below that one could still commit, and such a watcher
// would never see it.
func (q *queries) LatestEventID(ctx context.Context) (int64, error) {
	if _, ok := q.db.dialect.(EventSerializer); ok {
		return q.eventHorizon(ctx)
	}
	var id int64
	if err := q.row(ctx, `SELECT COALESCE(MAX(id), 0) FROM events`).Scan(&id); err != nil {
		return 0, fmt.Errorf("latest event id: %w", q.db.classify(err))
	}
	return id, nil
}

func (q *queries) PruneEvents(ctx context.Context, lowBefore, highBefore time.Time, limit int) (int64, error) {
	// The bound on created_at lets the batch walk the events_created index
	// from its oldest end instead of scanning the table.
	res, err := q.exec(ctx, limited("events", "id", `created_at < ? AND ((severity < ? AND created_at < ?) OR (severity >= ? AND created_at < ?))`,
		"created_at", limit), ts(later(lowBefore, highBefore)), int(store.SeverityHigh), ts(lowBefore), int(store.SeverityHigh), ts(highBefore))
	if err != nil {
		return 0, fmt.Errorf("prune events: %w", err)
	}
	return res.RowsAffected()
}
