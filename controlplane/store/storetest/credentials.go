package storetest

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
)

// testCredentials covers BMC credentials and nodes' BMC settings.
func testCredentials(t *testing.T, s store.Store) {
	c := ctx(t)
	sealed := []byte{0, 1, 2, 0xff, 0xfe}
	must(t, s.CreateCredential(c, &store.Credential{Name: "rack-a", Username: "root", Sealed: sealed, CreatedAt: t0, UpdatedAt: t0}))
	wantErr(t, s.CreateCredential(c, &store.Credential{Name: "rack-a", Username: "x", Sealed: []byte{1}, CreatedAt: t0, UpdatedAt: t0}), store.ErrAlreadyExists)
	must(t, s.CreateCredential(c, &store.Credential{Name: "rack-b", Username: "admin", Sealed: []byte{9}, CreatedAt: t0, UpdatedAt: t0}))
	got, err := s.GetCredential(c, "rack-a")
	must(t, err)
	if got.Username != "root" || !bytes.Equal(got.Sealed, sealed) || !got.CreatedAt.Equal(t0) {
		t.Fatalf("credential = %+v", got)
	}
	_, err = s.GetCredential(c, "nope")
	wantErr(t, err, store.ErrNotFound)
	got.Username, got.Sealed, got.UpdatedAt = "admin", []byte{7, 7}, t0.Add(time.Hour)
	must(t, s.UpdateCredential(c, got))
	if rot, err := s.GetCredential(c, "rack-a"); err != nil || rot.Username != "admin" || !bytes.Equal(rot.Sealed, []byte{7, 7}) ||
		!rot.UpdatedAt.Equal(t0.Add(time.Hour)) || !rot.CreatedAt.Equal(t0) {
		t.Fatalf("rotated credential = %+v, %v", rot, err)
	}
	wantErr(t, s.UpdateCredential(c, &store.Credential{Name: "nope", Username: "x", Sealed: []byte{1}}), store.ErrNotFound)
	list, err := s.ListCredentials(c)
	must(t, err)
	if len(list) != 2 || list[0].Name != "rack-a" || list[1].Name != "rack-b" {
		t.Fatalf("list = %+v", list)
	}

	bmc := store.NodeBMC{Address: "redfish://10.0.0.5/redfish/v1/Systems/1", Credential: "rack-a",
		CAPEM: "-----BEGIN CERTIFICATE-----\n...", Fingerprint: "sha256:" + strings.Repeat("a", 64), Insecure: true, BootMode: "Legacy"}
	tpl := seedTemplate(t, s, "bm")
	n := &store.Node{Name: "bm-1", TemplateID: tpl.ID, Enabled: true, MACs: []string{"52:54:00:00:00:61"}, BMC: bmc, CreatedAt: t0, UpdatedAt: t0}
	must(t, s.Tx(c, func(q store.Queries) error { return q.CreateNode(c, n) }))
	seedNode(t, s, "plain")
	for _, get := range []func() (*store.Node, error){
		func() (*store.Node, error) { return s.GetNode(c, "bm-1") },
		func() (*store.Node, error) { return s.GetNodeByID(c, n.ID) },
		func() (*store.Node, error) { return s.GetNodeByMAC(c, "52:54:00:00:00:61") },
	} {
		rn, err := get()
		must(t, err)
		if rn.BMC != bmc {
			t.Fatalf("BMC read back %+v, want %+v", rn.BMC, bmc)
		}
	}
	withBMC, err := s.ListNodes(c, store.NodeFilter{HasBMC: true}, store.Page{})
	must(t, err)
	if len(withBMC) != 1 || withBMC[0].Name != "bm-1" || withBMC[0].BMC != bmc {
		t.Fatalf("nodes with a BMC = %+v", withBMC)
	}
	all, err := s.ListNodes(c, store.NodeFilter{}, store.Page{})
	must(t, err)
	if len(all) != 2 {
		t.Fatalf("all nodes = %d", len(all))
	}

	// A credential in use cannot be deleted; once no node names it, it can.
	err = s.DeleteCredential(c, "rack-a")
	wantErr(t, err, store.ErrConflict)
	if !strings.Contains(err.Error(), "bm-1") {
		t.Errorf("refusal does not name the node: %v", err)
	}
	n.BMC = store.NodeBMC{}
	must(t, s.Tx(c, func(q store.Queries) error { return q.UpdateNode(c, n) }))
	rn, err := s.GetNode(c, "bm-1")
	must(t, err)
	if rn.BMC != (store.NodeBMC{}) {
		t.Fatalf("BMC not cleared: %+v", rn.BMC)
	}
	must(t, s.DeleteCredential(c, "rack-a"))
	wantErr(t, s.DeleteCredential(c, "rack-a"), store.ErrNotFound)
}
