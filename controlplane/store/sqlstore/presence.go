package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
)

// livePresence is the claim's evidence test for the member aliased i: an
// open presence whose lease runs past the bound time.
const livePresence = `EXISTS (SELECT 1 FROM agent_presence ap WHERE ap.instance_id = i.id AND ap.lost_at IS NULL AND ap.lease_until > ?)`

func (q *queries) OpenPresence(ctx context.Context, p *store.Presence) error {
	_, err := q.exec(ctx, `INSERT INTO agent_presence (instance_id, replica, stream_id, connected_at, lease_until, lost_at)
		VALUES (?, ?, ?, ?, ?, NULL)
		ON CONFLICT (instance_id) DO UPDATE SET replica = excluded.replica, stream_id = excluded.stream_id,
			connected_at = excluded.connected_at, lease_until = excluded.lease_until, lost_at = NULL`,
		string(p.InstanceID), p.Replica, p.StreamID, ts(p.ConnectedAt), ts(p.LeaseUntil))
	if err != nil {
		return fmt.Errorf("open presence of %s: %w", p.InstanceID, err)
	}
	return nil
}

func (q *queries) ClosePresence(ctx context.Context, instanceID store.InstanceID, streamID string, at time.Time) (bool, error) {
	res, err := q.exec(ctx, `UPDATE agent_presence SET lost_at = ?, lease_until = ? WHERE instance_id = ? AND stream_id = ? AND lost_at IS NULL`,
		ts(at), ts(at), string(instanceID), streamID)
	if err != nil {
		return false, fmt.Errorf("close presence of %s: %w", instanceID, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("close presence of %s: %w", instanceID, q.db.classify(err))
	}
	return n > 0, nil
}

func (q *queries) RenewPresence(ctx context.Context, replica string, until time.Time) (int64, error) {
	res, err := q.exec(ctx, `UPDATE agent_presence SET lease_until = ? WHERE replica = ? AND lost_at IS NULL`, ts(until), replica)
	if err != nil {
		return 0, fmt.Errorf("renew presence of replica %s: %w", replica, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("renew presence of replica %s: %w", replica, q.db.classify(err))
	}
	return n, nil
}

func (q *queries) ExpirePresence(ctx context.Context, replica string, at time.Time) (int64, error) {
	var res sql.Result
	var err error
	if replica == "" {
		res, err = q.exec(ctx, `UPDATE agent_presence SET lost_at = ?, lease_until = ? WHERE lost_at IS NULL`, ts(at), ts(at))
	} else {
		res, err = q.exec(ctx, `UPDATE agent_presence SET lost_at = ?, lease_until = ? WHERE replica = ? AND lost_at IS NULL`, ts(at), ts(at), replica)
	}
	if err != nil {
		return 0, fmt.Errorf("expire presence of replica %q: %w", replica, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("expire presence of replica %q: %w", replica, q.db.classify(err))
	}
	return n, nil
}

func (q *queries) ListPresence(ctx context.Context, ids []store.InstanceID) (map[store.InstanceID]*store.Presence, error) {
	out := make(map[store.InstanceID]*store.Presence, len(ids))
	for len(ids) > 0 {
		chunk := ids[:min(len(ids), 500)]
		ids = ids[len(chunk):]
		rows, err := q.query(ctx, `SELECT instance_id, replica, stream_id, connected_at, lease_until, lost_at FROM agent_presence
			WHERE instance_id `+in(len(chunk)), anySlice(chunk)...)
		if err != nil {
			return nil, fmt.Errorf("list presence: %w", err)
		}
		ps, err := collect(q, rows, func(r scanner) (*store.Presence, error) {
			p := &store.Presence{}
			var connected, lease int64
			var lost sql.NullInt64
			if err := r.Scan(&p.InstanceID, &p.Replica, &p.StreamID, &connected, &lease, &lost); err != nil {
				return nil, err
			}
			p.ConnectedAt, p.LeaseUntil, p.LostAt = fromTS(connected), fromTS(lease), fromNTS(lost)
			return p, nil
		})
		if err != nil {
			return nil, fmt.Errorf("list presence: %w", err)
		}
		for _, p := range ps {
			out[p.InstanceID] = p
		}
	}
	return out, nil
}
