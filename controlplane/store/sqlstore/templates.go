package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/tetherfleet/tether/controlplane/store"
)

const templateCols = `id, name, kernel_digest, initramfs_digest, kernel_args, require_signed, required_signers, created_at, updated_at, console, require_attestation`

func scanTemplate(s scanner) (*store.Template, error) {
	var t store.Template
	var created, updated int64
	var signers string
	if err := s.Scan(&t.ID, &t.Name, &t.KernelDigest, &t.InitramfsDigest, &t.KernelArgs, &t.RequireSignedModules, &signers, &created, &updated, &t.Console, &t.RequireAttestation); err != nil {
		return nil, err
	}
	if signers != "" {
		t.RequiredSigners = strings.Split(signers, ",")
	}
	t.CreatedAt, t.UpdatedAt = fromTS(created), fromTS(updated)
	return &t, nil
}

func (q *queries) CreateTemplate(ctx context.Context, t *store.Template) error {
	if t.ID == "" {
		t.ID = store.TemplateID(newID())
	}
	_, err := q.exec(ctx, `INSERT INTO templates (`+templateCols+`) VALUES (?,?,?,?,?,?,?,?,?,?,?)`,
		t.ID, t.Name, t.KernelDigest, t.InitramfsDigest, t.KernelArgs, t.RequireSignedModules, strings.Join(t.RequiredSigners, ","), ts(t.CreatedAt), ts(t.UpdatedAt), t.Console, t.RequireAttestation)
	if err != nil {
		return fmt.Errorf("create template %q: %w", t.Name, err)
	}
	return q.writeTemplateModules(ctx, t)
}

func (q *queries) writeTemplateModules(ctx context.Context, t *store.Template) error {
	if _, err := q.exec(ctx, `DELETE FROM template_modules WHERE template_id = ?`, t.ID); err != nil {
		return fmt.Errorf("template %q modules: %w", t.Name, err)
	}
	write := func(kind string, refs []store.ModuleRef) error {
		for i, r := range refs {
			if _, err := q.exec(ctx, `INSERT INTO template_modules (template_id, kind, position, module_name, module_version) VALUES (?,?,?,?,?)`,
				t.ID, kind, i, r.Name, r.Version); err != nil {
				return fmt.Errorf("template %q module %s:%s: %w", t.Name, r.Name, r.Version, err)
			}
		}
		return nil
	}
	if err := write("root", t.RootModules); err != nil {
		return err
	}
	return write("ext", t.ExtensionModules)
}

func (q *queries) loadTemplateModules(ctx context.Context, ts []*store.Template) error {
	if len(ts) == 0 {
		return nil
	}
	byID := make(map[store.TemplateID]*store.Template, len(ts))
	ids := make([]store.TemplateID, 0, len(ts))
	for _, t := range ts {
		byID[t.ID] = t
		t.RootModules, t.ExtensionModules = nil, nil
		ids = append(ids, t.ID)
	}
	rows, err := q.query(ctx, `SELECT template_id, kind, module_name, module_version FROM template_modules WHERE template_id `+in(len(ids))+` ORDER BY template_id, kind, position`, anySlice(ids)...)
	if err != nil {
		return fmt.Errorf("load template modules: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id store.TemplateID
		var kind string
		var r store.ModuleRef
		if err := rows.Scan(&id, &kind, &r.Name, &r.Version); err != nil {
			return fmt.Errorf("load template modules: %w", err)
		}
		t := byID[id]
		if kind == "root" {
			t.RootModules = append(t.RootModules, r)
		} else {
			t.ExtensionModules = append(t.ExtensionModules, r)
		}
	}
	return rows.Err()
}

func (q *queries) getTemplate(ctx context.Context, where string, key string) (*store.Template, error) {
	t, err := scanTemplate(q.row(ctx, `SELECT `+templateCols+` FROM templates WHERE `+where+` = ?`, key))
	if err != nil {
		return nil, notFound(q.db.classify(err), "template", key)
	}
	if err := q.loadTemplateModules(ctx, []*store.Template{t}); err != nil {
		return nil, err
	}
	return t, nil
}

func (q *queries) GetTemplate(ctx context.Context, name string) (*store.Template, error) {
	return q.getTemplate(ctx, "name", name)
}

func (q *queries) GetTemplateByID(ctx context.Context, id store.TemplateID) (*store.Template, error) {
	return q.getTemplate(ctx, "id", id.String())
}

func (q *queries) ListTemplates(ctx context.Context, p store.Page) ([]*store.Template, error) {
	p = p.Normalize()
	rows, err := q.query(ctx, `SELECT `+templateCols+` FROM templates WHERE name > ? ORDER BY name LIMIT ?`, p.After, p.Limit)
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	out, err := collect(q, rows, scanTemplate)
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	return out, q.loadTemplateModules(ctx, out)
}

func (q *queries) UpdateTemplate(ctx context.Context, t *store.Template) error {
	res, err := q.exec(ctx, `UPDATE templates SET kernel_digest = ?, initramfs_digest = ?, kernel_args = ?, require_signed = ?, required_signers = ?, updated_at = ?, console = ?, require_attestation = ? WHERE id = ?`,
		t.KernelDigest, t.InitramfsDigest, t.KernelArgs, t.RequireSignedModules, strings.Join(t.RequiredSigners, ","), ts(t.UpdatedAt), t.Console, t.RequireAttestation, t.ID)
	if err := mustAffect(res, err, "template", t.Name); err != nil {
		return err
	}
	return q.writeTemplateModules(ctx, t)
}

func (q *queries) DeleteTemplate(ctx context.Context, name string) error {
	t, err := q.GetTemplate(ctx, name)
	if err != nil {
		return err
	}
	var users []string
	for _, probe := range []struct{ what, query string }{
		{"node", `SELECT name FROM nodes WHERE template_id = ? ORDER BY name LIMIT 5`},
		{"pool", `SELECT name FROM pools WHERE template_id = ? ORDER BY name LIMIT 5`},
	} {
		rows, err := q.query(ctx, probe.query, t.ID)
		if err != nil {
			return fmt.Errorf("delete template %q: %w", name, err)
		}
		names, err := collect(q, rows, func(s scanner) (string, error) { var n string; return n, s.Scan(&n) })
		if err != nil {
			return fmt.Errorf("delete template %q: %w", name, err)
		}
		for _, n := range names {
			users = append(users, probe.what+" "+n)
		}
	}
	if len(users) > 0 {
		return store.Errorf(store.ErrConflict, "template %q is used by %s", name, strings.Join(users, ", "))
	}
	if _, err := q.exec(ctx, `DELETE FROM template_modules WHERE template_id = ?`, t.ID); err != nil {
		return fmt.Errorf("delete template %q: %w", name, err)
	}
	res, err := q.exec(ctx, `DELETE FROM templates WHERE id = ?`, t.ID)
	return mustAffect(res, err, "template", name)
}

// collect scans every row. Errors are classified like the query's own: a
// connection lost in the middle of a read is Unavailable, not a bug.
func collect[T any](q *queries, rows *sql.Rows, scan func(scanner) (T, error)) ([]T, error) {
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, q.db.classify(err)
		}
		out = append(out, v)
	}
	return out, q.db.classify(rows.Err())
}

// mustAffect turns "no row changed" into ErrNotFound.
func mustAffect(res sql.Result, err error, what string, key any) error {
	if err != nil {
		return fmt.Errorf("%s %q: %w", what, key, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("%s %q: %w", what, key, err)
	}
	if n == 0 {
		return store.Errorf(store.ErrNotFound, "%s %q", what, key)
	}
	return nil
}
