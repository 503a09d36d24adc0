package sqlstore

import (
	"context"
	"fmt"

	"github.com/tetherfleet/tether/controlplane/store"
)

const leaseCols = `ip, mac, expires_at, updated_at`

func scanLease(s scanner) (*store.DHCPLease, error) {
	var l store.DHCPLease
	var exp, upd int64
	if err := s.Scan(&l.IP, &l.MAC, &exp, &upd); err != nil {
		return nil, err
	}
	l.ExpiresAt, l.UpdatedAt = fromTS(exp), fromTS(upd)
	return &l, nil
}

func (q *queries) GetDHCPLeaseByMAC(ctx context.Context, mac string) (*store.DHCPLease, error) {
	l, err := scanLease(q.row(ctx, `SELECT `+leaseCols+` FROM dhcp_leases WHERE mac = ?`, mac))
	if err != nil {
		return nil, notFound(q.db.classify(err), "dhcp lease of", mac)
	}
	return l, nil
}

func (q *queries) GetDHCPLeaseByIP(ctx context.Context, ip string) (*store.DHCPLease, error) {
	l, err := scanLease(q.row(ctx, `SELECT `+leaseCols+` FROM dhcp_leases WHERE ip = ?`, ip))
	if err != nil {
		return nil, notFound(q.db.classify(err), "dhcp lease", ip)
	}
	return l, nil
}

func (q *queries) ListDHCPLeases(ctx context.Context) ([]*store.DHCPLease, error) {
	rows, err := q.query(ctx, `SELECT `+leaseCols+` FROM dhcp_leases ORDER BY ip`)
	if err != nil {
		return nil, fmt.Errorf("list dhcp leases: %w", err)
	}
	out, err := collect(q, rows, scanLease)
	if err != nil {
		return nil, fmt.Errorf("list dhcp leases: %w", err)
	}
	return out, nil
}

func (q *queries) CreateDHCPLease(ctx context.Context, l *store.DHCPLease) error {
	_, err := q.exec(ctx, `INSERT INTO dhcp_leases (`+leaseCols+`) VALUES (?,?,?,?)`, l.IP, l.MAC, ts(l.ExpiresAt), ts(l.UpdatedAt))
	if err != nil {
		return fmt.Errorf("lease %s to %s: %w", l.IP, l.MAC, err)
	}
	return nil
}

func (q *queries) UpdateDHCPLease(ctx context.Context, l *store.DHCPLease) error {
	res, err := q.exec(ctx, `UPDATE dhcp_leases SET expires_at = ?, updated_at = ? WHERE ip = ? AND mac = ?`, ts(l.ExpiresAt), ts(l.UpdatedAt), l.IP, l.MAC)
	return mustAffect(res, err, "dhcp lease", l.IP)
}

func (q *queries) DeleteDHCPLease(ctx context.Context, ip string) error {
	if _, err := q.exec(ctx, `DELETE FROM dhcp_leases WHERE ip = ?`, ip); err != nil {
		return fmt.Errorf("delete dhcp lease %s: %w", ip, err)
	}
	return nil
}
