package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
)

// The CA rotation set (docs/design.md §3.10). Keys arrive sealed; this
// layer stores bytes.

const authorityCols = `fingerprint, cert_pem, key_sealed, cross_pem, state, not_after, created_at, updated_at`

func scanAuthority(s scanner) (*store.Authority, error) {
	var a store.Authority
	var na, created, updated int64
	if err := s.Scan(&a.Fingerprint, &a.CertPEM, &a.KeySealed, &a.CrossPEM, &a.State, &na, &created, &updated); err != nil {
		return nil, err
	}
	a.NotAfter, a.CreatedAt, a.UpdatedAt = fromTS(na), fromTS(created), fromTS(updated)
	return &a, nil
}

func (q *queries) CreateAuthority(ctx context.Context, a *store.Authority) error {
	sealed := a.KeySealed
	if sealed == nil {
		sealed = []byte{}
	}
	_, err := q.exec(ctx, `INSERT INTO certificate_authorities (`+authorityCols+`) VALUES (?,?,?,?,?,?,?,?)`,
		a.Fingerprint, a.CertPEM, sealed, a.CrossPEM, a.State, ts(a.NotAfter), ts(a.CreatedAt), ts(a.UpdatedAt))
	if err != nil {
		return fmt.Errorf("record CA %s (%s): %w", a.Fingerprint, a.State, q.db.classify(err))
	}
	return nil
}

func (q *queries) ListAuthorities(ctx context.Context) ([]*store.Authority, error) {
	rows, err := q.query(ctx, `SELECT `+authorityCols+` FROM certificate_authorities ORDER BY created_at, fingerprint`)
	if err != nil {
		return nil, fmt.Errorf("list CAs: %w", err)
	}
	out, err := collect(q, rows, scanAuthority)
	if err != nil {
		return nil, fmt.Errorf("list CAs: %w", err)
	}
	return out, nil
}

func (q *queries) SetAuthorityState(ctx context.Context, fingerprint, from, to string, now time.Time) error {
	res, err := q.exec(ctx, `UPDATE certificate_authorities SET state = ?, updated_at = ? WHERE fingerprint = ? AND state = ?`,
		to, ts(now), fingerprint, from)
	if err != nil {
		return fmt.Errorf("CA %s %s → %s: %w", fingerprint, from, to, q.db.classify(err))
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("CA %s %s → %s: %w", fingerprint, from, to, err)
	} else if n == 1 {
		return nil
	}
	var state string
	if err := q.row(ctx, `SELECT state FROM certificate_authorities WHERE fingerprint = ?`, fingerprint).Scan(&state); err != nil {
		return notFound(q.db.classify(err), "CA", fingerprint)
	}
	return store.Errorf(store.ErrConflict, "CA %s is %s, not %s", fingerprint, state, from)
}

func (q *queries) CountLiveCertificates(ctx context.Context, now time.Time) (map[string]int, error) {
	rows, err := q.query(ctx, `SELECT issuer, COUNT(*) FROM certificates WHERE revoked_at IS NULL AND not_after > ? GROUP BY issuer`, ts(now))
	if err != nil {
		return nil, fmt.Errorf("count live certificates: %w", err)
	}
	type count struct {
		issuer string
		n      int
	}
	counts, err := collect(q, rows, func(s scanner) (count, error) {
		var c count
		return c, s.Scan(&c.issuer, &c.n)
	})
	if err != nil {
		return nil, fmt.Errorf("count live certificates: %w", err)
	}
	out := make(map[string]int, len(counts))
	for _, c := range counts {
		out[c.issuer] = c.n
	}
	return out, nil
}

func (q *queries) AssignCertificateIssuer(ctx context.Context, issuer string) (int, error) {
	res, err := q.exec(ctx, `UPDATE certificates SET issuer = ? WHERE issuer = ''`, issuer)
	if err != nil {
		return 0, fmt.Errorf("assign certificate issuer: %w", err)
	}
	n, err := res.RowsAffected()
	return int(n), err
}
