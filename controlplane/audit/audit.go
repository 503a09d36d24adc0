// Package audit records who did what through the admin API. A call that
// changes something carries an Entry in its context; the first store
// transaction it commits appends the record inside that same transaction,
// so an effect never exists without its record. A call that commits
// nothing (a refusal, a failure, an audited read) is recorded when it ends.
//
// A record holds names, never secrets: the identity, its role and
// certificate serial, the method, a target named by id or name, and the
// result code. Tokens, keys and CSRs never reach it (see Target).
package audit

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/tetherfleet/tether/controlplane/store"
)

// Entry is the record of one call in progress.
type Entry struct {
	mu      sync.Mutex
	rec     store.AuditRecord
	written bool
}

// NewEntry starts the record of a call.
func NewEntry(rec store.AuditRecord) *Entry { return &Entry{rec: rec} }

type entryKey struct{}

// With carries e through a call.
func With(ctx context.Context, e *Entry) context.Context {
	return context.WithValue(ctx, entryKey{}, e)
}

// From returns the call's entry, nil outside an audited call.
func From(ctx context.Context) *Entry {
	e, _ := ctx.Value(entryKey{}).(*Entry)
	return e
}

func (e *Entry) pending() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return !e.written
}

func (e *Entry) record(code string) store.AuditRecord {
	e.mu.Lock()
	defer e.mu.Unlock()
	r := e.rec
	r.Code = code
	return r
}

func (e *Entry) markWritten() {
	e.mu.Lock()
	e.written = true
	e.mu.Unlock()
}

// Wrap returns s with Tx appending a pending entry's record in the same
// transaction as the call's first committed effect.
func Wrap(s store.Store) store.Store { return &txStore{Store: s} }

type txStore struct{ store.Store }

func (s *txStore) Tx(ctx context.Context, fn func(q store.Queries) error) error {
	e := From(ctx)
	if e == nil || !e.pending() {
		return s.Store.Tx(ctx, fn)
	}
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		if err := fn(q); err != nil {
			return err
		}
		r := e.record("OK")
		return q.AppendAudit(ctx, &r)
	})
	if err == nil {
		e.markWritten()
	}
	return err
}

// Finish records how a call ended unless a transaction already recorded
// it: a refusal or a failure gets its code, a call that committed nothing
// (an audited read) gets OK. A call that committed and then failed gets a
// second record with the failure.
func Finish(ctx context.Context, s store.Store, e *Entry, code string) error {
	e.mu.Lock()
	written := e.written
	e.mu.Unlock()
	if written && code == "OK" {
		return nil
	}
	r := e.record(code)
	// Through a transaction, not a bare write: on SQLite that joins the
	// group commit, where a bare write waited in SQLite's busy handler
	// behind it and, under load, gave up after 10 s (SQLITE_BUSY) and lost
	// the records of failed calls. The entry is taken off the context, or
	// Wrap's Tx would append it a second time.
	bare := With(context.WithoutCancel(ctx), nil)
	if err := s.Tx(bare, func(q store.Queries) error { return q.AppendAudit(bare, &r) }); err != nil {
		return fmt.Errorf("audit %s by %s: %w", r.Method, r.Identity, err)
	}
	e.markWritten()
	return nil
}

// targetFields name what a call acts on, in order of preference. Only
// these string fields are ever read: a token, key or CSR field can never
// end up in a record.
var targetFields = []protoreflect.Name{"instance_id", "id", "serial", "name", "pool", "node", "template", "task_id", "signer", "identity", "mac"}

// Target names what req acts on ("name=base version=1"), from a fixed list
// of identifying fields.
func Target(req any) string {
	m, ok := req.(proto.Message)
	if !ok {
		return ""
	}
	r := m.ProtoReflect()
	fields := r.Descriptor().Fields()
	out := ""
	for _, n := range targetFields {
		fd := fields.ByName(n)
		if fd == nil || fd.Kind() != protoreflect.StringKind || fd.IsList() || !r.Has(fd) {
			continue
		}
		v := r.Get(fd).String()
		if len(v) > 200 {
			v = v[:200]
		}
		if out != "" {
			out += " "
		}
		out += string(n) + "=" + v
		if fv := fields.ByName("version"); n == "name" && fv != nil && fv.Kind() == protoreflect.StringKind && r.Has(fv) {
			out += " version=" + r.Get(fv).String()
		}
	}
	return out
}
