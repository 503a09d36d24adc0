package storetest

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
)

// testTrust covers signers, module signatures, a template's required
// signers, admin identities and the audit trail.
func testTrust(t *testing.T, s store.Store) {
	c := ctx(t)
	fpA, fpB := "sha256:"+strings.Repeat("a", 64), "sha256:"+strings.Repeat("b", 64)

	must(t, s.CreateSigner(c, &store.Signer{Name: "alice", Fingerprint: fpA, PublicKey: bytes.Repeat([]byte{1}, 32), CreatedAt: t0}))
	wantErr(t, s.CreateSigner(c, &store.Signer{Name: "alice", Fingerprint: fpB, PublicKey: []byte{2}, CreatedAt: t0}), store.ErrAlreadyExists)
	wantErr(t, s.CreateSigner(c, &store.Signer{Name: "other", Fingerprint: fpA, PublicKey: []byte{2}, CreatedAt: t0}), store.ErrAlreadyExists)
	must(t, s.CreateSigner(c, &store.Signer{Name: "bob", Fingerprint: fpB, PublicKey: bytes.Repeat([]byte{2}, 32), CreatedAt: t0}))
	signers, err := s.ListSigners(c)
	must(t, err)
	if len(signers) != 2 || signers[0].Name != "alice" || !bytes.Equal(signers[0].PublicKey, bytes.Repeat([]byte{1}, 32)) {
		t.Fatalf("signers = %+v", signers)
	}
	must(t, s.DeleteSigner(c, fpB))
	wantErr(t, s.DeleteSigner(c, "bob"), store.ErrNotFound)

	m := seedModule(t, s, "base", "1")
	seedModule(t, s, "base", "2")
	sig := func(fp string, b byte) store.ModuleSignature {
		return store.ModuleSignature{Signer: fp, SignerName: "n" + fp[7:8], PublicKey: bytes.Repeat([]byte{b}, 32), Signature: bytes.Repeat([]byte{b}, 64), CreatedAt: t0}
	}
	must(t, s.AddModuleSignature(c, "base", "1", sig(fpA, 1)))
	must(t, s.AddModuleSignature(c, "base", "1", sig(fpB, 2)))
	// A second signature by the same signer replaces the first.
	must(t, s.AddModuleSignature(c, "base", "1", sig(fpB, 3)))
	wantErr(t, s.AddModuleSignature(c, "base", "9", sig(fpA, 1)), store.ErrConflict)
	got, err := s.GetModule(c, "base", "1")
	must(t, err)
	if len(got.Signatures) != 2 || got.Signatures[1].Signer != fpB || got.Signatures[1].Signature[0] != 3 {
		t.Fatalf("signatures = %+v", got.Signatures)
	}
	list, err := s.ListModules(c, "base", store.Page{})
	must(t, err)
	if len(list) != 2 || len(list[0].Signatures) != 2 || len(list[1].Signatures) != 0 {
		t.Fatalf("listed signatures: %d %d", len(list[0].Signatures), len(list[1].Signatures))
	}

	tpl := &store.Template{Name: "signed", RootModules: []store.ModuleRef{ref(m.Name, m.Version)}, RequiredSigners: []string{fpA, fpB}, CreatedAt: t0, UpdatedAt: t0}
	must(t, s.CreateTemplate(c, tpl))
	rt, err := s.GetTemplate(c, "signed")
	must(t, err)
	if strings.Join(rt.RequiredSigners, ",") != fpA+","+fpB {
		t.Fatalf("required signers = %v", rt.RequiredSigners)
	}
	rt.RequiredSigners = nil
	must(t, s.UpdateTemplate(c, rt))
	if rt, err = s.GetTemplateByID(c, tpl.ID); err != nil || len(rt.RequiredSigners) != 0 {
		t.Fatalf("cleared required signers = %v %v", rt.RequiredSigners, err)
	}
	must(t, s.DeleteTemplate(c, "signed"))
	// Deleting a module takes its signatures with it.
	must(t, s.DeleteModule(c, "base", "1"))
	seedModule(t, s, "base", "1")
	if got, err = s.GetModule(c, "base", "1"); err != nil || len(got.Signatures) != 0 {
		t.Fatalf("a re-pushed module inherited signatures: %+v %v", got, err)
	}

	id := &store.AdminIdentity{Name: "otto", Role: "operator", Serial: "01", NotAfter: t0.Add(time.Hour), CreatedAt: t0}
	must(t, s.PutAdminIdentity(c, id))
	id.Serial, id.RevokedAt = "02", t0.Add(time.Minute)
	must(t, s.PutAdminIdentity(c, id))
	gi, err := s.GetAdminIdentity(c, "otto")
	must(t, err)
	if gi.Serial != "02" || !gi.RevokedAt.Equal(t0.Add(time.Minute)) || !gi.CreatedAt.Equal(t0) {
		t.Fatalf("identity = %+v", gi)
	}
	_, err = s.GetAdminIdentity(c, "nobody")
	wantErr(t, err, store.ErrNotFound)
	ids, err := s.ListAdminIdentities(c)
	must(t, err)
	if len(ids) != 1 {
		t.Fatalf("identities = %d", len(ids))
	}

	for i := 0; i < 5; i++ {
		who := "otto"
		if i%2 == 1 {
			who = "admin"
		}
		r := &store.AuditRecord{At: t0.Add(time.Duration(i) * time.Hour), Identity: who, Role: "operator", Serial: "02", Method: "TerminateInstance", Target: fmt.Sprintf("id=i-%d", i), Code: "OK"}
		must(t, s.AppendAudit(c, r))
		if r.ID == 0 {
			t.Fatal("AppendAudit assigned no id")
		}
	}
	otto, err := s.ListAudit(c, store.AuditFilter{Identity: "otto"})
	must(t, err)
	if len(otto) != 3 || otto[0].Target != "id=i-0" || otto[2].Target != "id=i-4" {
		t.Fatalf("otto's records = %+v", otto)
	}
	since, err := s.ListAudit(c, store.AuditFilter{Since: t0.Add(3 * time.Hour)})
	must(t, err)
	if len(since) != 2 {
		t.Fatalf("records since +3h = %d", len(since))
	}
	after, err := s.ListAudit(c, store.AuditFilter{AfterID: otto[1].ID, Limit: 1})
	must(t, err)
	if len(after) != 1 || after[0].ID <= otto[1].ID {
		t.Fatalf("records after %d = %+v", otto[1].ID, after)
	}
	// A batch of one takes the oldest record; the next batch the other.
	n, err := s.DeleteAuditBefore(c, t0.Add(2*time.Hour), 1)
	must(t, err)
	if rest, _ := s.ListAudit(c, store.AuditFilter{Since: t0}); n != 1 || len(rest) != 4 || !rest[0].At.Equal(t0.Add(time.Hour)) {
		t.Fatalf("a batch of one pruned %d, left %+v; want the record at t0 gone", n, rest)
	}
	n, err = s.DeleteAuditBefore(c, t0.Add(2*time.Hour), 0)
	must(t, err)
	if rest, _ := s.ListAudit(c, store.AuditFilter{}); n != 1 || len(rest) != 3 {
		t.Fatalf("pruned %d, %d left", n, len(rest))
	}
}
