package audit_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/audit"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

func TestTargetNamesNeverSecrets(t *testing.T) {
	tests := []struct {
		req  any
		want string
	}{
		{&v1.CreateBootstrapTokenRequest{InstanceId: "i-1", TtlSeconds: 5}, "instance_id=i-1"},
		{&v1.CreateIdentityRequest{Name: "otto", Role: "admin", CsrPem: "-----BEGIN CERTIFICATE REQUEST-----"}, "name=otto"},
		{&v1.RenewIdentityRequest{CsrPem: "-----BEGIN CERTIFICATE REQUEST-----"}, ""},
		{&v1.EnrollRequest{Token: "tbt_secret", CsrPem: "csr"}, ""},
		{&v1.AddSignerRequest{Name: "alice", PublicKey: []byte{1, 2}}, "name=alice"},
		{&v1.DeleteModuleRequest{Name: "base", Version: "1"}, "name=base version=1"},
		{"not a message", ""},
	}
	for _, tt := range tests {
		if got := audit.Target(tt.req); got != tt.want {
			t.Errorf("Target(%T) = %q, want %q", tt.req, got, tt.want)
		}
	}
}

func TestRecordWrittenWithTheFirstEffect(t *testing.T) {
	ctx := context.Background()
	raw, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "t.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	st := audit.Wrap(raw)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	count := func() []*store.AuditRecord {
		rs, err := st.ListAudit(ctx, store.AuditFilter{})
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	e := audit.NewEntry(store.AuditRecord{At: t0, Identity: "otto", Role: "operator", Serial: "01", Method: "CreateNode", Target: "name=n"})
	actx := audit.With(ctx, e)
	boom := errors.New("boom")
	// A rolled-back transaction leaves no record.
	if err := st.Tx(actx, func(q store.Queries) error { return boom }); !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if n := len(count()); n != 0 {
		t.Fatalf("%d records after a rollback", n)
	}
	// The first committed transaction carries the record; later ones do not.
	for i := 0; i < 2; i++ {
		if err := st.Tx(actx, func(q store.Queries) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if err := audit.Finish(actx, st, e, "OK"); err != nil {
		t.Fatal(err)
	}
	if rs := count(); len(rs) != 1 || rs[0].Code != "OK" || rs[0].Identity != "otto" {
		t.Fatalf("records = %+v, want one OK", rs)
	}
	// A call that fails after its effect gets a second record with the code.
	if err := audit.Finish(actx, st, e, "Internal"); err != nil {
		t.Fatal(err)
	}
	// A call with no effect is recorded when it ends.
	e2 := audit.NewEntry(store.AuditRecord{At: t0, Identity: "otto", Method: "TerminateInstance"})
	if err := audit.Finish(audit.With(ctx, e2), st, e2, "NotFound"); err != nil {
		t.Fatal(err)
	}
	rs := count()
	if len(rs) != 3 || rs[1].Code != "Internal" || rs[2].Code != "NotFound" {
		t.Fatalf("records = %+v", rs)
	}
	// Outside an audited call, transactions write nothing extra.
	if err := st.Tx(ctx, func(q store.Queries) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if n := len(count()); n != 3 {
		t.Fatalf("%d records, want 3", n)
	}
}

// bareWrites fails a test on an audit record appended outside a
// transaction: on SQLite such a write does not join the group commit.
type bareWrites struct {
	store.Store
	t *testing.T
}

func (b bareWrites) AppendAudit(context.Context, *store.AuditRecord) error {
	b.t.Error("an audit record was appended outside a transaction")
	return nil
}

func TestFinishWritesInATransaction(t *testing.T) {
	ctx := context.Background()
	raw, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "t.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	for _, st := range []store.Store{bareWrites{raw, t}, audit.Wrap(bareWrites{raw, t})} {
		e := audit.NewEntry(store.AuditRecord{At: time.Unix(0, 0), Identity: "otto", Method: "ClaimFromPool"})
		if err := audit.Finish(audit.With(ctx, e), st, e, "ResourceExhausted"); err != nil {
			t.Fatal(err)
		}
	}
	rs, err := raw.ListAudit(ctx, store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].Code != "ResourceExhausted" || rs[1].Code != "ResourceExhausted" {
		t.Fatalf("records = %+v, want one per Finish", rs)
	}
}
