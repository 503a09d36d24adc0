package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/tetherfleet/tether/controlplane/store"
)

const nodeCols = `id, name, template_id, enabled, config, public_address, created_at, updated_at,
	bmc_address, bmc_credential, bmc_ca, bmc_fingerprint, bmc_insecure, bmc_boot_mode`

func scanNode(s scanner) (*store.Node, error) {
	var n store.Node
	var config string
	var created, updated int64
	b := &n.BMC
	if err := s.Scan(&n.ID, &n.Name, &n.TemplateID, &n.Enabled, &config, &n.PublicAddress, &created, &updated,
		&b.Address, &b.Credential, &b.CAPEM, &b.Fingerprint, &b.Insecure, &b.BootMode); err != nil {
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
	b := n.BMC
	_, err := q.exec(ctx, `INSERT INTO nodes (`+nodeCols+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		n.ID, n.Name, n.TemplateID, n.Enabled, jsonObject(n.Config), n.PublicAddress, ts(n.CreatedAt), ts(n.UpdatedAt),
		b.Address, b.Credential, b.CAPEM, b.Fingerprint, b.Insecure, b.BootMode)
	if err != nil {
		return fmt.Errorf("create node %q: %w", n.Name, err)
	}
	if len(n.MACs) == 0 {
		return nil // nothing to replace: spare pool replenishment a statement
	}
	return q.setMACs(ctx, n)
}

// setMACs makes n.MACs the node's whole set of hardware addresses. An
// address of another node is named in the error; the primary key refuses
// it anyway if two writers race past the check.
func (q *queries) setMACs(ctx context.Context, n *store.Node) error {
	if len(n.MACs) > 0 {
		rows, err := q.query(ctx, `SELECT m.mac, n.name FROM node_macs m JOIN nodes n ON n.id = m.node_id WHERE m.node_id <> ? AND m.mac `+in(len(n.MACs))+` ORDER BY m.mac LIMIT 1`,
			append([]any{n.ID}, anySlice(n.MACs)...)...)
		if err != nil {
			return fmt.Errorf("node %q: check hardware addresses: %w", n.Name, err)
		}
		taken, err := collect(q, rows, func(s scanner) (store.MACInUseError, error) {
			var e store.MACInUseError
			return e, s.Scan(&e.MAC, &e.Node)
		})
		if err != nil {
			return fmt.Errorf("node %q: check hardware addresses: %w", n.Name, err)
		}
		if len(taken) > 0 {
			return &taken[0]
		}
	}
	if _, err := q.exec(ctx, `DELETE FROM node_macs WHERE node_id = ?`, n.ID); err != nil {
		return fmt.Errorf("node %q: replace hardware addresses: %w", n.Name, err)
	}
	for i, mac := range n.MACs {
		if _, err := q.exec(ctx, `INSERT INTO node_macs (mac, node_id, position) VALUES (?,?,?)`, mac, n.ID, i); err != nil {
			return fmt.Errorf("node %q: hardware address %s: %w", n.Name, mac, err)
		}
	}
	return nil
}

// loadMACs fills MACs of nodes with one query.
func (q *queries) loadMACs(ctx context.Context, nodes ...*store.Node) error {
	if len(nodes) == 0 {
		return nil
	}
	byID := make(map[string]*store.Node, len(nodes))
	ids := make([]string, 0, len(nodes))
	for _, n := range nodes {
		byID[n.ID] = n
		ids = append(ids, n.ID)
		n.MACs = nil
	}
	rows, err := q.query(ctx, `SELECT node_id, mac FROM node_macs WHERE node_id `+in(len(ids))+` ORDER BY node_id, position`, anySlice(ids)...)
	if err != nil {
		return fmt.Errorf("read hardware addresses: %w", err)
	}
	pairs, err := collect(q, rows, func(s scanner) ([2]string, error) {
		var p [2]string
		return p, s.Scan(&p[0], &p[1])
	})
	if err != nil {
		return fmt.Errorf("read hardware addresses: %w", err)
	}
	for _, p := range pairs {
		n := byID[p[0]]
		n.MACs = append(n.MACs, p[1])
	}
	return nil
}

func (q *queries) GetNodeByMAC(ctx context.Context, mac string) (*store.Node, error) {
	n, err := scanNode(q.row(ctx, `SELECT `+prefixCols("n.", nodeCols)+` FROM nodes n JOIN node_macs m ON m.node_id = n.id WHERE m.mac = ?`, mac))
	if err != nil {
		err = q.db.classify(err)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, store.Errorf(store.ErrNotFound, "no node has hardware address %s", mac)
		}
		return nil, err
	}
	return n, q.loadMACs(ctx, n)
}

func (q *queries) GetNode(ctx context.Context, name string) (*store.Node, error) {
	n, err := scanNode(q.row(ctx, `SELECT `+nodeCols+` FROM nodes WHERE name = ?`, name))
	if err != nil {
		return nil, notFound(q.db.classify(err), "node", name)
	}
	return n, q.loadMACs(ctx, n)
}

func (q *queries) GetNodeByID(ctx context.Context, id string) (*store.Node, error) {
	n, err := scanNode(q.row(ctx, `SELECT `+nodeCols+` FROM nodes WHERE id = ?`, id))
	if err != nil {
		return nil, notFound(q.db.classify(err), "node", id)
	}
	return n, q.loadMACs(ctx, n)
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
	if f.HasBMC {
		where += ` AND bmc_address <> ''`
	}
	rows, err := q.query(ctx, `SELECT `+nodeCols+` FROM nodes WHERE `+where+` ORDER BY name LIMIT ?`, append(args, p.Limit)...)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	out, err := collect(q, rows, scanNode)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	return out, q.loadMACs(ctx, out...)
}

func (q *queries) UpdateNode(ctx context.Context, n *store.Node) error {
	b := n.BMC
	res, err := q.exec(ctx, `UPDATE nodes SET template_id = ?, enabled = ?, config = ?, public_address = ?, updated_at = ?,
		bmc_address = ?, bmc_credential = ?, bmc_ca = ?, bmc_fingerprint = ?, bmc_insecure = ?, bmc_boot_mode = ? WHERE id = ?`,
		n.TemplateID, n.Enabled, jsonObject(n.Config), n.PublicAddress, ts(n.UpdatedAt),
		b.Address, b.Credential, b.CAPEM, b.Fingerprint, b.Insecure, b.BootMode, n.ID)
	if err := mustAffect(res, err, "node", n.Name); err != nil {
		return err
	}
	return q.setMACs(ctx, n)
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
	if _, err := q.exec(ctx, `DELETE FROM node_macs WHERE node_id = ?`, n.ID); err != nil {
		return fmt.Errorf("delete node %q: %w", name, err)
	}
	if _, err := q.exec(ctx, `DELETE FROM instances WHERE node_id = ?`, n.ID); err != nil {
		return fmt.Errorf("delete node %q: %w", name, err)
	}
	res, err := q.exec(ctx, `DELETE FROM nodes WHERE id = ?`, n.ID)
	return mustAffect(res, err, "node", name)
}
