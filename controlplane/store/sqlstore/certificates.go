package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
)

const certCols = `serial, instance_id, kind, subject, not_before, not_after, revoked_at, revoke_reason, created_at, issuer`

func scanCert(s scanner) (*store.Certificate, error) {
	var c store.Certificate
	var nb, na, created int64
	var revoked sql.NullInt64
	if err := s.Scan(&c.Serial, &c.InstanceID, &c.Kind, &c.Subject, &nb, &na, &revoked, &c.RevokeReason, &created, &c.Issuer); err != nil {
		return nil, err
	}
	c.NotBefore, c.NotAfter, c.RevokedAt, c.CreatedAt = fromTS(nb), fromTS(na), fromNTS(revoked), fromTS(created)
	return &c, nil
}

func (q *queries) CreateCertificate(ctx context.Context, c *store.Certificate) error {
	_, err := q.exec(ctx, `INSERT INTO certificates (`+certCols+`) VALUES (?,?,?,?,?,?,?,?,?,?)`,
		string(c.Serial), string(c.InstanceID), string(c.Kind), c.Subject, ts(c.NotBefore), ts(c.NotAfter), nts(c.RevokedAt), c.RevokeReason, ts(c.CreatedAt), c.Issuer)
	if err != nil {
		return fmt.Errorf("record certificate %s: %w", c.Serial, err)
	}
	return nil
}

func (q *queries) GetCertificate(ctx context.Context, serial store.CertSerial) (*store.Certificate, error) {
	c, err := scanCert(q.row(ctx, `SELECT `+certCols+` FROM certificates WHERE serial = ?`, string(serial)))
	if err != nil {
		return nil, notFound(q.db.classify(err), "certificate", string(serial))
	}
	return c, nil
}

func (q *queries) ListCertificates(ctx context.Context, f store.CertificateFilter, p store.Page) ([]*store.Certificate, error) {
	p = p.Normalize()
	where, args := `serial > ?`, []any{p.After}
	if f.InstanceID != "" {
		where += ` AND instance_id = ?`
		args = append(args, string(f.InstanceID))
	}
	if f.Subject != "" {
		where += ` AND subject = ?`
		args = append(args, f.Subject)
	}
	rows, err := q.query(ctx, `SELECT `+certCols+` FROM certificates WHERE `+where+` ORDER BY serial LIMIT ?`, append(args, p.Limit)...)
	if err != nil {
		return nil, fmt.Errorf("list certificates: %w", err)
	}
	out, err := collect(q, rows, scanCert)
	if err != nil {
		return nil, fmt.Errorf("list certificates: %w", err)
	}
	return out, nil
}

func (q *queries) RevokeCertificate(ctx context.Context, serial store.CertSerial, reason string, now time.Time) (*store.Certificate, error) {
	// Revoking twice keeps the first time and reason.
	if _, err := q.exec(ctx, `UPDATE certificates SET revoked_at = ?, revoke_reason = ? WHERE serial = ? AND revoked_at IS NULL`,
		ts(now), reason, string(serial)); err != nil {
		return nil, fmt.Errorf("revoke certificate %s: %w", serial, err)
	}
	return q.GetCertificate(ctx, serial)
}

func (q *queries) RevokeInstanceCertificates(ctx context.Context, instanceID store.InstanceID, reason string, now time.Time) ([]store.CertSerial, error) {
	rows, err := q.query(ctx, `SELECT serial FROM certificates WHERE instance_id = ? AND revoked_at IS NULL`, string(instanceID))
	if err != nil {
		return nil, fmt.Errorf("revoke certificates of %s: %w", instanceID, err)
	}
	serials, err := collect(q, rows, func(s scanner) (store.CertSerial, error) { var v store.CertSerial; return v, s.Scan(&v) })
	if err != nil {
		return nil, fmt.Errorf("revoke certificates of %s: %w", instanceID, err)
	}
	if len(serials) == 0 {
		return nil, nil
	}
	if _, err := q.exec(ctx, `UPDATE certificates SET revoked_at = ?, revoke_reason = ? WHERE instance_id = ? AND revoked_at IS NULL`,
		ts(now), reason, string(instanceID)); err != nil {
		return nil, fmt.Errorf("revoke certificates of %s: %w", instanceID, err)
	}
	return serials, nil
}

func (q *queries) ListRevokedSerials(ctx context.Context, now time.Time) ([]store.CertSerial, error) {
	rows, err := q.query(ctx, `SELECT serial FROM certificates WHERE revoked_at IS NOT NULL AND not_after > ?`, ts(now))
	if err != nil {
		return nil, fmt.Errorf("list revoked certificates: %w", err)
	}
	out, err := collect(q, rows, func(s scanner) (store.CertSerial, error) { var v store.CertSerial; return v, s.Scan(&v) })
	if err != nil {
		return nil, fmt.Errorf("list revoked certificates: %w", err)
	}
	return out, nil
}
