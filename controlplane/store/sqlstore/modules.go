package sqlstore

import (
	"context"
	"fmt"
	"strings"

	"github.com/tetherfleet/tether/controlplane/store"
)

const moduleCols = `name, version, digest, size, signature, created_at`

func scanModule(s scanner) (*store.Module, error) {
	var m store.Module
	var created int64
	if err := s.Scan(&m.Name, &m.Version, &m.Digest, &m.Size, &m.Signature, &created); err != nil {
		return nil, err
	}
	m.CreatedAt = fromTS(created)
	return &m, nil
}

func (q *queries) CreateModule(ctx context.Context, m *store.Module) error {
	sig := m.Signature
	if sig == nil {
		sig = []byte{}
	}
	_, err := q.exec(ctx, `INSERT INTO modules (`+moduleCols+`) VALUES (?,?,?,?,?,?)`,
		m.Name, m.Version, m.Digest, m.Size, sig, ts(m.CreatedAt))
	if err != nil {
		return fmt.Errorf("create module %s:%s: %w", m.Name, m.Version, err)
	}
	return nil
}

func (q *queries) GetModule(ctx context.Context, name, version string) (*store.Module, error) {
	m, err := scanModule(q.row(ctx, `SELECT `+moduleCols+` FROM modules WHERE name = ? AND version = ?`, name, version))
	if err != nil {
		return nil, notFound(q.db.classify(err), "module", name+":"+version)
	}
	return m, q.loadModuleSignatures(ctx, []*store.Module{m})
}

func (q *queries) ListModules(ctx context.Context, name string, p store.Page) ([]*store.Module, error) {
	p = p.Normalize()
	afterName, afterVersion := store.SplitModuleCursor(p.After)
	where := `(name > ? OR (name = ? AND version > ?))`
	args := []any{afterName, afterName, afterVersion}
	if name != "" {
		where += ` AND name = ?`
		args = append(args, name)
	}
	args = append(args, p.Limit)
	rows, err := q.query(ctx, `SELECT `+moduleCols+` FROM modules WHERE `+where+` ORDER BY name, version LIMIT ?`, args...)
	if err != nil {
		return nil, fmt.Errorf("list modules: %w", err)
	}
	out, err := collect(q, rows, scanModule)
	if err != nil {
		return nil, fmt.Errorf("list modules: %w", err)
	}
	return out, q.loadModuleSignatures(ctx, out)
}

func (q *queries) DeleteModule(ctx context.Context, name, version string) error {
	rows, err := q.query(ctx, `SELECT DISTINCT t.name FROM template_modules tm JOIN templates t ON t.id = tm.template_id
		WHERE tm.module_name = ? AND tm.module_version = ? ORDER BY t.name LIMIT 5`, name, version)
	if err != nil {
		return fmt.Errorf("delete module %s:%s: %w", name, version, err)
	}
	users, err := collect(q, rows, func(s scanner) (string, error) { var n string; return n, s.Scan(&n) })
	if err != nil {
		return fmt.Errorf("delete module %s:%s: %w", name, version, err)
	}
	if len(users) > 0 {
		return store.Errorf(store.ErrConflict, "module %s:%s is referenced by template %s", name, version, strings.Join(users, ", "))
	}
	if _, err := q.exec(ctx, `DELETE FROM module_signatures WHERE module_name = ? AND module_version = ?`, name, version); err != nil {
		return fmt.Errorf("delete module %s:%s signatures: %w", name, version, err)
	}
	res, err := q.exec(ctx, `DELETE FROM modules WHERE name = ? AND version = ?`, name, version)
	return mustAffect(res, err, "module", name+":"+version)
}

func (q *queries) CountModulesWithDigest(ctx context.Context, digest string) (int, error) {
	var n int
	if err := q.row(ctx, `SELECT COUNT(*) FROM modules WHERE digest = ?`, digest).Scan(&n); err != nil {
		return 0, fmt.Errorf("count modules with digest: %w", q.db.classify(err))
	}
	return n, nil
}
