package sqlstore

import (
	"context"
	"database/sql"

	"fmt"
	"strings"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
)

// Signers, module signatures, admin identities and the audit trail.

func (q *queries) AddModuleSignature(ctx context.Context, name, version string, sig store.ModuleSignature) error {
	if _, err := q.exec(ctx, `DELETE FROM module_signatures WHERE module_name = ? AND module_version = ? AND signer = ?`, name, version, sig.Signer); err != nil {
		return fmt.Errorf("sign module %s:%s: %w", name, version, err)
	}
	_, err := q.exec(ctx, `INSERT INTO module_signatures (module_name, module_version, signer, signer_name, public_key, signature, created_at) VALUES (?,?,?,?,?,?,?)`,
		name, version, sig.Signer, sig.SignerName, sig.PublicKey, sig.Signature, ts(sig.CreatedAt))
	if err != nil {
		return fmt.Errorf("sign module %s:%s: %w", name, version, q.db.classify(err))
	}
	return nil
}

// loadModuleSignatures fills Signatures for ms in one query.
func (q *queries) loadModuleSignatures(ctx context.Context, ms []*store.Module) error {
	if len(ms) == 0 {
		return nil
	}
	byKey := make(map[string]*store.Module, len(ms))
	names := make([]string, 0, len(ms))
	for _, m := range ms {
		byKey[m.Name+"\x00"+m.Version] = m
		names = append(names, m.Name)
	}
	rows, err := q.query(ctx, `SELECT module_name, module_version, signer, signer_name, public_key, signature, created_at
		FROM module_signatures WHERE module_name `+in(len(names))+` ORDER BY module_name, module_version, created_at, signer`, anySlice(names)...)
	if err != nil {
		return fmt.Errorf("module signatures: %w", err)
	}
	type row struct {
		key string
		sig store.ModuleSignature
	}
	got, err := collect(q, rows, func(s scanner) (row, error) {
		var r row
		var n, v string
		var created int64
		err := s.Scan(&n, &v, &r.sig.Signer, &r.sig.SignerName, &r.sig.PublicKey, &r.sig.Signature, &created)
		r.key, r.sig.CreatedAt = n+"\x00"+v, fromTS(created)
		return r, err
	})
	if err != nil {
		return fmt.Errorf("module signatures: %w", err)
	}
	for _, r := range got {
		if m, ok := byKey[r.key]; ok {
			m.Signatures = append(m.Signatures, r.sig)
		}
	}
	return nil
}

func (q *queries) CreateSigner(ctx context.Context, s *store.Signer) error {
	_, err := q.exec(ctx, `INSERT INTO signers (fingerprint, name, public_key, created_at) VALUES (?,?,?,?)`,
		s.Fingerprint, s.Name, s.PublicKey, ts(s.CreatedAt))
	if err != nil {
		return fmt.Errorf("add signer %q (%s): %w", s.Name, s.Fingerprint, q.db.classify(err))
	}
	return nil
}

func (q *queries) ListSigners(ctx context.Context) ([]*store.Signer, error) {
	rows, err := q.query(ctx, `SELECT fingerprint, name, public_key, created_at FROM signers ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list signers: %w", err)
	}
	out, err := collect(q, rows, func(s scanner) (*store.Signer, error) {
		var x store.Signer
		var created int64
		err := s.Scan(&x.Fingerprint, &x.Name, &x.PublicKey, &created)
		x.CreatedAt = fromTS(created)
		return &x, err
	})
	if err != nil {
		return nil, fmt.Errorf("list signers: %w", err)
	}
	return out, nil
}

func (q *queries) DeleteSigner(ctx context.Context, nameOrFingerprint string) error {
	res, err := q.exec(ctx, `DELETE FROM signers WHERE name = ? OR fingerprint = ?`, nameOrFingerprint, nameOrFingerprint)
	return mustAffect(res, err, "signer", nameOrFingerprint)
}

const identityCols = `name, role, serial, not_after, created_at, revoked_at`

func scanIdentity(s scanner) (*store.AdminIdentity, error) {
	var id store.AdminIdentity
	var na, created int64
	var revoked sql.NullInt64
	if err := s.Scan(&id.Name, &id.Role, &id.Serial, &na, &created, &revoked); err != nil {
		return nil, err
	}
	id.NotAfter, id.CreatedAt = fromTS(na), fromTS(created)
	if r := fromNTS(revoked); r != nil {
		id.RevokedAt = *r
	}
	return &id, nil
}

func (q *queries) PutAdminIdentity(ctx context.Context, id *store.AdminIdentity) error {
	var revoked *time.Time
	if !id.RevokedAt.IsZero() {
		revoked = &id.RevokedAt
	}
	res, err := q.exec(ctx, `UPDATE admin_identities SET role = ?, serial = ?, not_after = ?, revoked_at = ? WHERE name = ?`,
		string(id.Role), string(id.Serial), ts(id.NotAfter), nts(revoked), id.Name)
	if err != nil {
		return fmt.Errorf("record identity %q: %w", id.Name, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("record identity %q: %w", id.Name, err)
	} else if n > 0 {
		return nil
	}
	if _, err := q.exec(ctx, `INSERT INTO admin_identities (`+identityCols+`) VALUES (?,?,?,?,?,?)`,
		id.Name, string(id.Role), string(id.Serial), ts(id.NotAfter), ts(id.CreatedAt), nts(revoked)); err != nil {
		return fmt.Errorf("record identity %q: %w", id.Name, q.db.classify(err))
	}
	return nil
}

func (q *queries) GetAdminIdentity(ctx context.Context, name string) (*store.AdminIdentity, error) {
	id, err := scanIdentity(q.row(ctx, `SELECT `+identityCols+` FROM admin_identities WHERE name = ?`, name))
	if err != nil {
		return nil, notFound(q.db.classify(err), "identity", name)
	}
	return id, nil
}

func (q *queries) ListAdminIdentities(ctx context.Context) ([]*store.AdminIdentity, error) {
	rows, err := q.query(ctx, `SELECT `+identityCols+` FROM admin_identities ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list identities: %w", err)
	}
	out, err := collect(q, rows, scanIdentity)
	if err != nil {
		return nil, fmt.Errorf("list identities: %w", err)
	}
	return out, nil
}

func (q *queries) AppendAudit(ctx context.Context, r *store.AuditRecord) error {
	err := q.row(ctx, `INSERT INTO audit (at, identity, role, serial, method, target, code) VALUES (?,?,?,?,?,?,?) RETURNING id`,
		ts(r.At), r.Identity, string(r.Role), string(r.Serial), r.Method, r.Target, r.Code).Scan(&r.ID)
	if err != nil {
		return fmt.Errorf("append audit record for %s: %w", r.Method, q.db.classify(err))
	}
	return nil
}

func (q *queries) ListAudit(ctx context.Context, f store.AuditFilter) ([]*store.AuditRecord, error) {
	where, args := []string{"id > ?"}, []any{f.AfterID}
	if f.Identity != "" {
		where, args = append(where, "identity = ?"), append(args, f.Identity)
	}
	if !f.Since.IsZero() {
		where, args = append(where, "at >= ?"), append(args, ts(f.Since))
	}
	limit := store.Page{Limit: f.Limit}.Normalize().Limit
	rows, err := q.query(ctx, `SELECT id, at, identity, role, serial, method, target, code FROM audit WHERE `+
		strings.Join(where, " AND ")+` ORDER BY id LIMIT ?`, append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("list audit: %w", err)
	}
	out, err := collect(q, rows, func(s scanner) (*store.AuditRecord, error) {
		var r store.AuditRecord
		var at int64
		err := s.Scan(&r.ID, &at, &r.Identity, &r.Role, &r.Serial, &r.Method, &r.Target, &r.Code)
		r.At = fromTS(at)
		return &r, err
	})
	if err != nil {
		return nil, fmt.Errorf("list audit: %w", err)
	}
	return out, nil
}

func (q *queries) DeleteAuditBefore(ctx context.Context, before time.Time, limit int) (int, error) {
	res, err := q.exec(ctx, limited("audit", "id", `at < ?`, "at", limit), ts(before))
	if err != nil {
		return 0, fmt.Errorf("prune audit: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("prune audit: %w", err)
	}
	return int(n), nil
}
