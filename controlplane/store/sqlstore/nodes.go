package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
)

const nodeCols = `id, name, template_id, enabled, config, public_address, created_at, updated_at,
	bmc_address, bmc_credential, bmc_ca, bmc_fingerprint, bmc_insecure, bmc_boot_mode, require_attestation`

func scanNode(s scanner) (*store.Node, error) {
	var n store.Node
	var config string
	var created, updated int64
	b := &n.BMC
	if err := s.Scan(&n.ID, &n.Name, &n.TemplateID, &n.Enabled, &config, &n.PublicAddress, &created, &updated,
		&b.Address, &b.Credential, &b.CAPEM, &b.Fingerprint, &b.Insecure, &b.BootMode, &n.RequireAttestation); err != nil {
		return nil, err
	}
	n.Config = []byte(config)
	n.CreatedAt, n.UpdatedAt = fromTS(created), fromTS(updated)
	return &n, nil
}

func (q *queries) CreateNode(ctx context.Context, n *store.Node) error {
	if n.ID == "" {
		n.ID = store.NodeID(newID())
	}
	b := n.BMC
	_, err := q.exec(ctx, `INSERT INTO nodes (`+nodeCols+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		n.ID, n.Name, n.TemplateID, n.Enabled, jsonObject(n.Config), n.PublicAddress, ts(n.CreatedAt), ts(n.UpdatedAt),
		b.Address, b.Credential, b.CAPEM, b.Fingerprint, b.Insecure, b.BootMode, n.RequireAttestation)
	if err != nil {
		return fmt.Errorf("create node %q: %w", n.Name, err)
	}
	// Nothing to replace when empty: spares pool replenishment statements.
	if len(n.EKHashes) > 0 {
		if err := q.setEKs(ctx, n, n.CreatedAt); err != nil {
			return err
		}
	}
	if len(n.MACs) == 0 {
		return nil
	}
	return q.setMACs(ctx, n)
}

// setEKs makes n.EKHashes the node's whole set of endorsement key hashes.
// A hash of another node is named in the error; the primary key refuses
// it anyway if two writers race past the check. Hashes the node already
// holds keep their row (and the time they were bound), so rewriting an
// unchanged node costs one read.
func (q *queries) setEKs(ctx context.Context, n *store.Node, now time.Time) error {
	if len(n.EKHashes) > 0 {
		rows, err := q.query(ctx, `SELECT e.ek_hash, n.name FROM node_eks e JOIN nodes n ON n.id = e.node_id WHERE e.node_id <> ? AND e.ek_hash `+in(len(n.EKHashes))+` ORDER BY e.ek_hash LIMIT 1`,
			append([]any{n.ID}, anySlice(n.EKHashes)...)...)
		if err != nil {
			return fmt.Errorf("node %q: check endorsement keys: %w", n.Name, err)
		}
		taken, err := collect(q, rows, func(s scanner) (store.EKInUseError, error) {
			var e store.EKInUseError
			return e, s.Scan(&e.EK, &e.Node)
		})
		if err != nil {
			return fmt.Errorf("node %q: check endorsement keys: %w", n.Name, err)
		}
		if len(taken) > 0 {
			return &taken[0]
		}
	}
	rows, err := q.query(ctx, `SELECT ek_hash FROM node_eks WHERE node_id = ?`, n.ID)
	if err != nil {
		return fmt.Errorf("node %q: read endorsement keys: %w", n.Name, err)
	}
	held, err := collect(q, rows, func(s scanner) (string, error) { var h string; return h, s.Scan(&h) })
	if err != nil {
		return fmt.Errorf("node %q: read endorsement keys: %w", n.Name, err)
	}
	want := make(map[string]int, len(n.EKHashes))
	for i, h := range n.EKHashes {
		want[h] = i
	}
	have := make(map[string]bool, len(held))
	for _, h := range held {
		have[h] = true
		if _, keep := want[h]; !keep {
			if _, err := q.exec(ctx, `DELETE FROM node_eks WHERE ek_hash = ?`, h); err != nil {
				return fmt.Errorf("node %q: remove endorsement key %s: %w", n.Name, h, err)
			}
		}
	}
	for i, h := range n.EKHashes {
		var err error
		if have[h] {
			_, err = q.exec(ctx, `UPDATE node_eks SET position = ? WHERE ek_hash = ? AND position <> ?`, i, h, i)
		} else {
			_, err = q.exec(ctx, `INSERT INTO node_eks (ek_hash, node_id, position, created_at) VALUES (?,?,?,?)`, h, n.ID, i, ts(now))
		}
		if err != nil {
			err = q.db.classify(err)
			if errors.Is(err, store.ErrAlreadyExists) {
				// Another writer bound it between the check and this insert.
				return &store.EKInUseError{EK: h, Node: "(another node)"}
			}
			return fmt.Errorf("node %q: endorsement key %s: %w", n.Name, h, err)
		}
	}
	return nil
}

// loadEKs fills EKHashes of nodes with one query.
func (q *queries) loadEKs(ctx context.Context, nodes ...*store.Node) error {
	if len(nodes) == 0 {
		return nil
	}
	byID := make(map[store.NodeID]*store.Node, len(nodes))
	ids := make([]store.NodeID, 0, len(nodes))
	for _, n := range nodes {
		byID[n.ID] = n
		ids = append(ids, n.ID)
		n.EKHashes = nil
	}
	rows, err := q.query(ctx, `SELECT node_id, ek_hash FROM node_eks WHERE node_id `+in(len(ids))+` ORDER BY node_id, position`, anySlice(ids)...)
	if err != nil {
		return fmt.Errorf("read endorsement keys: %w", err)
	}
	pairs, err := collect(q, rows, func(s scanner) ([2]string, error) {
		var p [2]string
		return p, s.Scan(&p[0], &p[1])
	})
	if err != nil {
		return fmt.Errorf("read endorsement keys: %w", err)
	}
	for _, p := range pairs {
		n := byID[store.NodeID(p[0])]
		n.EKHashes = append(n.EKHashes, p[1])
	}
	return nil
}

// loadHardware fills the MACs and EK hashes of nodes.
func (q *queries) loadHardware(ctx context.Context, nodes ...*store.Node) error {
	if err := q.loadMACs(ctx, nodes...); err != nil {
		return err
	}
	return q.loadEKs(ctx, nodes...)
}

func (q *queries) NodeByEK(ctx context.Context, hash string) (*store.Node, error) {
	n, err := scanNode(q.row(ctx, `SELECT `+prefixCols("n.", nodeCols)+` FROM nodes n JOIN node_eks e ON e.node_id = n.id WHERE e.ek_hash = ?`, hash))
	if err != nil {
		err = q.db.classify(err)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, store.Errorf(store.ErrNotFound, "no node has endorsement key %s", hash)
		}
		return nil, err
	}
	return n, q.loadHardware(ctx, n)
}

func (q *queries) EKNodeID(ctx context.Context, hash string) (store.NodeID, error) {
	var id store.NodeID
	if err := q.row(ctx, `SELECT node_id FROM node_eks WHERE ek_hash = ?`, hash).Scan(&id); err != nil {
		err = q.db.classify(err)
		if errors.Is(err, sql.ErrNoRows) {
			return "", store.Errorf(store.ErrNotFound, "no node has endorsement key %s", hash)
		}
		return "", err
	}
	return id, nil
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
	byID := make(map[store.NodeID]*store.Node, len(nodes))
	ids := make([]store.NodeID, 0, len(nodes))
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
		n := byID[store.NodeID(p[0])]
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
	return n, q.loadHardware(ctx, n)
}

func (q *queries) GetNode(ctx context.Context, name string) (*store.Node, error) {
	n, err := scanNode(q.row(ctx, `SELECT `+nodeCols+` FROM nodes WHERE name = ?`, name))
	if err != nil {
		return nil, notFound(q.db.classify(err), "node", name)
	}
	return n, q.loadHardware(ctx, n)
}

func (q *queries) GetNodeByID(ctx context.Context, id store.NodeID) (*store.Node, error) {
	n, err := scanNode(q.row(ctx, `SELECT `+nodeCols+` FROM nodes WHERE id = ?`, string(id)))
	if err != nil {
		return nil, notFound(q.db.classify(err), "node", id)
	}
	return n, q.loadHardware(ctx, n)
}

func (q *queries) NodeNames(ctx context.Context, ids []store.NodeID) (map[store.NodeID]string, error) {
	out := make(map[store.NodeID]string, len(ids))
	// Chunks keep each statement well under SQLite's bound-variable limit.
	for start := 0; start < len(ids); start += 500 {
		chunk := ids[start:min(len(ids), start+500)]
		args := make([]any, len(chunk))
		for i, id := range chunk {
			args[i] = string(id)
		}
		rows, err := q.query(ctx, `SELECT id, name FROM nodes WHERE id IN (?`+strings.Repeat(`,?`, len(chunk)-1)+`)`, args...)
		if err != nil {
			return nil, fmt.Errorf("node names: %w", err)
		}
		for rows.Next() {
			var id store.NodeID
			var name string
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
	return out, q.loadHardware(ctx, out...)
}

func (q *queries) UpdateNode(ctx context.Context, n *store.Node) error {
	b := n.BMC
	res, err := q.exec(ctx, `UPDATE nodes SET template_id = ?, enabled = ?, config = ?, public_address = ?, updated_at = ?,
		bmc_address = ?, bmc_credential = ?, bmc_ca = ?, bmc_fingerprint = ?, bmc_insecure = ?, bmc_boot_mode = ?, require_attestation = ? WHERE id = ?`,
		n.TemplateID, n.Enabled, jsonObject(n.Config), n.PublicAddress, ts(n.UpdatedAt),
		b.Address, b.Credential, b.CAPEM, b.Fingerprint, b.Insecure, b.BootMode, n.RequireAttestation, n.ID)
	if err := mustAffect(res, err, "node", n.Name); err != nil {
		return err
	}
	if err := q.setEKs(ctx, n, n.UpdatedAt); err != nil {
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
	if _, err := q.exec(ctx, `DELETE FROM node_eks WHERE node_id = ?`, n.ID); err != nil {
		return fmt.Errorf("delete node %q: %w", name, err)
	}
	if _, err := q.exec(ctx, `DELETE FROM instances WHERE node_id = ?`, n.ID); err != nil {
		return fmt.Errorf("delete node %q: %w", name, err)
	}
	res, err := q.exec(ctx, `DELETE FROM nodes WHERE id = ?`, n.ID)
	return mustAffect(res, err, "node", name)
}
