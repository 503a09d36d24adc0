// Package catalog writes the catalogue of what boots: templates and
// nodes. Every write runs here, in one transaction, so the API layer
// validates requests and renders answers but never writes the store.
//
// The API applies a request's fields to the record (it knows the request's
// shape and field mask); this package owns the transaction, the read under
// it, the time stamps, the write and what a store refusal means.
package catalog

import (
	"context"
	"errors"

	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/clock"
)

// Service writes templates and nodes.
type Service struct {
	Store store.Store
	Clock clock.Clock
}

// Apply sets a record's fields inside the write's transaction; q reads
// what they refer to (modules, templates) under the same transaction.
type Apply[T any] func(q store.Queries, rec T) error

// CreateTemplate creates t after fill has set the fields that need the
// store (its modules, resolved under the transaction).
func (s *Service) CreateTemplate(ctx context.Context, t *store.Template, fill Apply[*store.Template]) error {
	now := s.Clock.Now()
	t.CreatedAt, t.UpdatedAt = now, now
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		if fill != nil {
			if err := fill(q, t); err != nil {
				return err
			}
		}
		return q.CreateTemplate(ctx, t)
	})
	if errors.Is(err, store.ErrAlreadyExists) {
		return fail.Exists("template %q already exists", t.Name)
	}
	return err
}

// UpdateTemplate reads the template name under the transaction, lets
// apply change it and writes it back.
func (s *Service) UpdateTemplate(ctx context.Context, name string, apply Apply[*store.Template]) (*store.Template, error) {
	var t *store.Template
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		var err error
		if t, err = q.GetTemplate(ctx, name); err != nil {
			return err
		}
		if err := apply(q, t); err != nil {
			return err
		}
		t.UpdatedAt = s.Clock.Now()
		return q.UpdateTemplate(ctx, t)
	})
	if err != nil {
		return nil, err
	}
	return t, nil
}

// DeleteTemplate deletes a template (the store refuses one still in use).
func (s *Service) DeleteTemplate(ctx context.Context, name string) error {
	return s.Store.Tx(ctx, func(q store.Queries) error { return q.DeleteTemplate(ctx, name) })
}

// CreateNode creates n on the template named template, and returns that
// template; check, when given, vets n under the same transaction.
func (s *Service) CreateNode(ctx context.Context, n *store.Node, template string, check ...Apply[*store.Node]) (*store.Template, error) {
	now := s.Clock.Now()
	n.CreatedAt, n.UpdatedAt = now, now
	var tpl *store.Template
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		var err error
		if tpl, err = TemplateFor(ctx, q, template); err != nil {
			return err
		}
		n.TemplateID = tpl.ID
		for _, c := range check {
			if err := c(q, n); err != nil {
				return err
			}
		}
		return q.CreateNode(ctx, n)
	})
	var inUse *store.MACInUseError
	var ekInUse *store.EKInUseError
	if errors.As(err, &inUse) || errors.As(err, &ekInUse) {
		// The caller names the address or EK and its owner; not "node exists".
		return nil, err
	}
	if errors.Is(err, store.ErrAlreadyExists) {
		return nil, fail.Exists("node %q already exists", n.Name)
	}
	if err != nil {
		return nil, err
	}
	return tpl, nil
}

// UpdateNode reads the node name under the transaction, lets apply change
// it and writes it back.
func (s *Service) UpdateNode(ctx context.Context, name string, apply Apply[*store.Node]) (*store.Node, error) {
	var n *store.Node
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		var err error
		if n, err = q.GetNode(ctx, name); err != nil {
			return err
		}
		if err := apply(q, n); err != nil {
			return err
		}
		n.UpdatedAt = s.Clock.Now()
		return q.UpdateNode(ctx, n)
	})
	if err != nil {
		return nil, err
	}
	return n, nil
}

// DeleteNode deletes a node (the store refuses one with live instances).
func (s *Service) DeleteNode(ctx context.Context, name string) error {
	return s.Store.Tx(ctx, func(q store.Queries) error { return q.DeleteNode(ctx, name) })
}

// TemplateFor reads the template a node names, refusing a missing one as
// bad input in the field "template".
func TemplateFor(ctx context.Context, q store.TemplateQueries, name string) (*store.Template, error) {
	tpl, err := q.GetTemplate(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fail.Invalid("template", "template %q does not exist", name)
	}
	return tpl, err
}
