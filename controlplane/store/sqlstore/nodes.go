package sqlstore

import (
	"context"
	"fmt"
	"strings"

	"github.com/tetherfleet/tether/controlplane/store"
)

const nodeCols = `id, name, template_id, enabled, config, public_address, created_at, updated_at`

func scanNode(s scanner) (*store.Node, error) {
	var n store.Node
	var config string
	var created, updated int64
	if err := s.Scan(&n.ID, &n.Name, &n.TemplateID, &n.Enabled, &config, &n.PublicAddress, &created, &updated); err != nil {
		return nil, err
	}
	n.Config = []byte(config)
	n.CreatedAt, n.UpdatedAt = fromTS(created), fromTS(updated)
	return &n, nil
}

func (q *queries) CreateNode(ctx context.Context, n *store.Node) error {
	if n.ID == "" {
		n.ID = newID()
	}
	_, err := q.exec(ctx, `INSERT INTO nodes (`+nodeCols+`) VALUES (?,?,?,?,?,?,?,?)`,
		n.ID, n.Name, n.TemplateID, n.Enabled, jsonObject(n.Config), n.PublicAddress, ts(n.CreatedAt), ts(n.UpdatedAt))
	if err != nil {
		return fmt.Errorf("create node %q: %w", n.Name, err)
	}
	return nil
}

func (q *queries) GetNode(ctx context.Context, name string) (*store.Node, error) {
	n, err := scanNode(q.row(ctx, `SELECT `+nodeCols+` FROM nodes WHERE name = ?`, name))
	if err != nil {
		return nil, notFound(q.db.classify(err), "node", name)
	}
	return n, nil
}

func (q *queries) GetNodeByID(ctx context.Context, id string) (*store.Node, error) {
	n, err := scanNode(q.row(ctx, `SELECT `+nodeCols+` FROM nodes WHERE id = ?`, id))
	if err != nil {
		return nil, notFound(q.db.classify(err), "node", id)
	}
	return n, nil
}

func (q *queries) NodeNames(ctx context.Context, ids []string) (map[string]string, error) {
	out := make(map[string]string, len(ids))
	// Chunks keep each statement well under SQLite's bound-variable limit.
	for start := 0; start < len(ids); start += 500 {
		chunk := ids[start:min(len(ids), start+500)]
		args := make([]any, len(chunk))
		for i, id := range chunk {
			args[i] = id
		}
		rows, err := q.query(ctx, `SELECT id, name FROM nodes WHERE id IN (?`+strings.Repeat(`,?`, len(chunk)-1)+`)`, args...)
		if err != nil {
			return nil, fmt.Errorf("node names: %w", err)
		}
		for rows.Next() {
			var id, name string
			if err := rows.Scan(&id, &name); err != nil {
				rows.Close()
				return nil, fmt.Errorf("node names: %w", q.db.classify(err))
			}
			out[id] = name
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, fmt.Errorf("node names: %w", q.db.classify(err))
		}
	}
	return out, nil
}

func (q *queries) ListNodes(ctx context.Context, f store.NodeFilter, p store.Page) ([]*store.Node, error) {
	p = p.Normalize()
	where, args := `name > ?`, []any{p.After}
	if f.TemplateID != "" {
		where += ` AND template_id = ?`
		args = append(args, f.TemplateID)
	}
	rows, err := q.query(ctx, `SELECT `+nodeCols+` FROM nodes WHERE `+where+` ORDER BY name LIMIT ?`, append(args, p.Limit)...)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	out, err := collect(q, rows, scanNode)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	return out, nil
}

func (q *queries) UpdateNode(ctx context.Context, n *store.Node) error {
	res, err := q.exec(ctx, `UPDATE nodes SET template_id = ?, enabled = ?, config = ?, public_address = ?, updated_at = ? WHERE id = ?`,
		n.TemplateID, n.Enabled, jsonObject(n.Config), n.PublicAddress, ts(n.UpdatedAt), n.ID)
	return mustAffect(res, err, "node", n.Name)
}

func (q *queries) DeleteNode(ctx context.Context, name string) error {
	n, err := q.GetNode(ctx, name)
	if err != nil {
		return err
	}
	rows, err := q.query(ctx, `SELECT id FROM instances WHERE node_id = ? AND status <> 'terminated' ORDER BY id LIMIT 5`, n.ID)
	if err != nil {
		return fmt.Errorf("delete node %q: %w", name, err)
	}
	live, err := collect(q, rows, func(s scanner) (string, error) { var id string; return id, s.Scan(&id) })
	if err != nil {
		return fmt.Errorf("delete node %q: %w", name, err)
	}
	if len(live) > 0 {
		return store.Errorf(store.ErrConflict, "node %q has instances that are not terminated: %s", name, strings.Join(live, ", "))
	}
	// Terminated instances keep their history rows (certificates, tasks,
	// events refer to the instance id, not the node), so only the instance
	// rows themselves go with the node.
	if _, err := q.exec(ctx, `DELETE FROM instances WHERE node_id = ?`, n.ID); err != nil {
		return fmt.Errorf("delete node %q: %w", name, err)
	}
	res, err := q.exec(ctx, `DELETE FROM nodes WHERE id = ?`, n.ID)
	return mustAffect(res, err, "node", name)
}
