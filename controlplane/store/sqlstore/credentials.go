package sqlstore

import (
	"context"
	"fmt"
	"strings"

	"github.com/tetherfleet/tether/controlplane/store"
)

// BMC credentials. The password arrives sealed; this layer stores bytes.

const credentialCols = `name, username, sealed, created_at, updated_at`

func scanCredential(s scanner) (*store.Credential, error) {
	var c store.Credential
	var created, updated int64
	if err := s.Scan(&c.Name, &c.Username, &c.Sealed, &created, &updated); err != nil {
		return nil, err
	}
	c.CreatedAt, c.UpdatedAt = fromTS(created), fromTS(updated)
	return &c, nil
}

func (q *queries) CreateCredential(ctx context.Context, c *store.Credential) error {
	_, err := q.exec(ctx, `INSERT INTO credentials (`+credentialCols+`) VALUES (?,?,?,?,?)`,
		c.Name, c.Username, c.Sealed, ts(c.CreatedAt), ts(c.UpdatedAt))
	if err != nil {
		return fmt.Errorf("create credential %q: %w", c.Name, q.db.classify(err))
	}
	return nil
}

func (q *queries) GetCredential(ctx context.Context, name string) (*store.Credential, error) {
	c, err := scanCredential(q.row(ctx, `SELECT `+credentialCols+` FROM credentials WHERE name = ?`, name))
	if err != nil {
		return nil, notFound(q.db.classify(err), "credential", name)
	}
	return c, nil
}

func (q *queries) UpdateCredential(ctx context.Context, c *store.Credential) error {
	res, err := q.exec(ctx, `UPDATE credentials SET username = ?, sealed = ?, updated_at = ? WHERE name = ?`,
		c.Username, c.Sealed, ts(c.UpdatedAt), c.Name)
	return mustAffect(res, err, "credential", c.Name)
}

func (q *queries) ListCredentials(ctx context.Context) ([]*store.Credential, error) {
	rows, err := q.query(ctx, `SELECT `+credentialCols+` FROM credentials ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list credentials: %w", err)
	}
	out, err := collect(q, rows, scanCredential)
	if err != nil {
		return nil, fmt.Errorf("list credentials: %w", err)
	}
	return out, nil
}

func (q *queries) DeleteCredential(ctx context.Context, name string) error {
	rows, err := q.query(ctx, `SELECT name FROM nodes WHERE bmc_credential = ? ORDER BY name LIMIT 5`, name)
	if err != nil {
		return fmt.Errorf("delete credential %q: %w", name, err)
	}
	users, err := collect(q, rows, func(s scanner) (string, error) { var n string; return n, s.Scan(&n) })
	if err != nil {
		return fmt.Errorf("delete credential %q: %w", name, err)
	}
	if len(users) > 0 {
		return store.Errorf(store.ErrConflict, "credential %q is used by nodes %s", name, strings.Join(users, ", "))
	}
	res, err := q.exec(ctx, `DELETE FROM credentials WHERE name = ?`, name)
	return mustAffect(res, err, "credential", name)
}
