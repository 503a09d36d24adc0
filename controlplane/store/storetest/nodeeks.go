package storetest

import (
	"errors"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
)

func ekHash(c byte) string { return "sha256:" + strings.Repeat(string(c), 64) }

func testNodeEKs(t *testing.T, s store.Store) {
	c := ctx(t)
	tpl := seedTemplate(t, s, "tpl")
	a := &store.Node{Name: "rack2-01", TemplateID: tpl.ID, EKHashes: []string{ekHash('b'), ekHash('a')}, RequireAttestation: true, CreatedAt: t0, UpdatedAt: t0}
	must(t, s.Tx(c, func(q store.Queries) error { return q.CreateNode(c, a) }))
	got, err := s.NodeByEK(c, ekHash('a'))
	must(t, err)
	if got.ID != a.ID || strings.Join(got.EKHashes, ",") != ekHash('b')+","+ekHash('a') || !got.RequireAttestation {
		t.Fatalf("NodeByEK = %+v, want rack2-01 with its EKs in order and require_attestation", got)
	}
	_, err = s.NodeByEK(c, ekHash('9'))
	wantErr(t, err, store.ErrNotFound)
	if id, err := s.EKNodeID(c, ekHash('b')); err != nil || id != a.ID {
		t.Fatalf("EKNodeID = %q, %v; want %s", id, err, a.ID)
	}
	_, err = s.EKNodeID(c, ekHash('9'))
	wantErr(t, err, store.ErrNotFound)

	// An EK of another node is refused, names that node and the hash, and writes nothing.
	b := &store.Node{Name: "rack2-02", TemplateID: tpl.ID, EKHashes: []string{ekHash('c'), ekHash('b')}, MACs: []string{"52:54:00:00:01:01"}, CreatedAt: t0, UpdatedAt: t0}
	err = s.Tx(c, func(q store.Queries) error { return q.CreateNode(c, b) })
	wantErr(t, err, store.ErrAlreadyExists)
	var inUse *store.EKInUseError
	if !errors.As(err, &inUse) || inUse.Node != "rack2-01" || inUse.EK != ekHash('b') {
		t.Fatalf("CreateNode with a taken EK: %v, want EKInUseError naming rack2-01 and %s", err, ekHash('b'))
	}
	_, err = s.GetNode(c, "rack2-02")
	wantErr(t, err, store.ErrNotFound)
	_, err = s.NodeByEK(c, ekHash('c'))
	wantErr(t, err, store.ErrNotFound)
	_, err = s.GetNodeByMAC(c, "52:54:00:00:01:01")
	wantErr(t, err, store.ErrNotFound)

	// An update that would take another node's EK is refused and leaves the node as it was.
	b.EKHashes = []string{ekHash('c')}
	must(t, s.Tx(c, func(q store.Queries) error { return q.CreateNode(c, b) }))
	b.EKHashes = []string{ekHash('d'), ekHash('a')}
	b.RequireAttestation = true
	err = s.Tx(c, func(q store.Queries) error { return q.UpdateNode(c, b) })
	if !errors.As(err, &inUse) || inUse.Node != "rack2-01" || inUse.EK != ekHash('a') {
		t.Fatalf("UpdateNode with a taken EK: %v", err)
	}
	got, err = s.GetNode(c, "rack2-02")
	must(t, err)
	if strings.Join(got.EKHashes, ",") != ekHash('c') || got.RequireAttestation {
		t.Fatalf("after a refused update rack2-02 = %v require=%v, want only %s and no requirement", got.EKHashes, got.RequireAttestation, ekHash('c'))
	}
	_, err = s.NodeByEK(c, ekHash('d'))
	wantErr(t, err, store.ErrNotFound)

	// UpdateNode replaces the set: an EK released by one node can be bound to another.
	a.EKHashes = []string{ekHash('b')}
	must(t, s.Tx(c, func(q store.Queries) error { return q.UpdateNode(c, a) }))
	must(t, s.Tx(c, func(q store.Queries) error { return q.UpdateNode(c, b) }))
	if got, err = s.NodeByEK(c, ekHash('a')); err != nil || got.Name != "rack2-02" {
		t.Fatalf("NodeByEK(a) after the move = %v, %v; want rack2-02", got, err)
	}
	// Reordering keeps the set and follows the order given.
	b.EKHashes = []string{ekHash('a'), ekHash('d')}
	must(t, s.Tx(c, func(q store.Queries) error { return q.UpdateNode(c, b) }))
	got, err = s.GetNode(c, "rack2-02")
	must(t, err)
	if strings.Join(got.EKHashes, ",") != ekHash('a')+","+ekHash('d') || !got.RequireAttestation {
		t.Fatalf("rack2-02 = %v require=%v", got.EKHashes, got.RequireAttestation)
	}
	// A node keeps its EKs across an update of other fields, and lists carry them.
	got.Enabled = false
	must(t, s.Tx(c, func(q store.Queries) error { return q.UpdateNode(c, got) }))
	list, err := s.ListNodes(c, store.NodeFilter{}, store.Page{})
	must(t, err)
	if len(list) != 2 || strings.Join(list[0].EKHashes, ",") != ekHash('b') || len(list[1].EKHashes) != 2 {
		t.Fatalf("ListNodes EKs = %v / %v", list[0].EKHashes, list[1].EKHashes)
	}
	// Clearing the set frees every hash.
	got.EKHashes = nil
	must(t, s.Tx(c, func(q store.Queries) error { return q.UpdateNode(c, got) }))
	_, err = s.NodeByEK(c, ekHash('d'))
	wantErr(t, err, store.ErrNotFound)

	// Deleting a node removes its EKs.
	must(t, s.DeleteNode(c, "rack2-01"))
	_, err = s.NodeByEK(c, ekHash('b'))
	wantErr(t, err, store.ErrNotFound)
	n := &store.Node{Name: "rack2-03", TemplateID: tpl.ID, EKHashes: []string{ekHash('b')}, CreatedAt: t0, UpdatedAt: t0}
	must(t, s.Tx(c, func(q store.Queries) error { return q.CreateNode(c, n) }))
}

func testTemplateRequireAttestation(t *testing.T, s store.Store) {
	c := ctx(t)
	tpl := seedTemplate(t, s, "attested")
	got, err := s.GetTemplate(c, "attested")
	must(t, err)
	if got.RequireAttestation {
		t.Fatal("a new template requires attestation by default")
	}
	got.RequireAttestation = true
	must(t, s.UpdateTemplate(c, got))
	if got, err = s.GetTemplateByID(c, tpl.ID); err != nil || !got.RequireAttestation {
		t.Fatalf("after update: %+v, %v; want require_attestation", got, err)
	}
}

func testEnrollGate(t *testing.T, s store.Store) {
	c := ctx(t)
	tpl := seedTemplate(t, s, "gate")
	plain := &store.Node{Name: "plain", TemplateID: tpl.ID, CreatedAt: t0, UpdatedAt: t0}
	strict := &store.Node{Name: "strict", TemplateID: tpl.ID, RequireAttestation: true, CreatedAt: t0, UpdatedAt: t0}
	must(t, s.CreateNode(c, plain))
	must(t, s.CreateNode(c, strict))
	pi, si := newInstance(plain.ID, lifecycle.Starting), newInstance(strict.ID, lifecycle.Pending)
	must(t, s.CreateInstance(c, pi))
	must(t, s.CreateInstance(c, si))

	check := func(id store.InstanceID, want store.EnrollGate) {
		t.Helper()
		g, err := s.EnrollGate(c, id)
		must(t, err)
		if g != want {
			t.Fatalf("EnrollGate(%s) = %+v, want %+v", id, g, want)
		}
	}
	check(pi.ID, store.EnrollGate{Status: lifecycle.Starting})
	check(si.ID, store.EnrollGate{Status: lifecycle.Pending, NodeRequiresAttestation: true})
	tp, err := s.GetTemplateByID(c, tpl.ID)
	must(t, err)
	tp.RequireAttestation = true
	must(t, s.UpdateTemplate(c, tp))
	check(pi.ID, store.EnrollGate{Status: lifecycle.Starting, TemplateRequiresAttestation: true})
	_, err = s.EnrollGate(c, "no-such-instance")
	wantErr(t, err, store.ErrNotFound)
}
