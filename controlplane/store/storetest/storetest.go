// Package storetest is the conformance suite every store backend passes.
// A backend's test calls Run with a factory that returns a fresh, empty
// store.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
)

// Factory returns a new empty store; the suite closes it.
type Factory func(t *testing.T) store.Store

// Run runs the whole suite.
func Run(t *testing.T, newStore Factory) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s store.Store)
	}{
		{"Templates", testTemplates},
		{"Modules", testModules},
		{"Nodes", testNodes},
		{"NodeMACs", testNodeMACs},
		{"NodeEKs", testNodeEKs},
		{"TemplateRequireAttestation", testTemplateRequireAttestation},
		{"EnrollGate", testEnrollGate},
		{"DHCPLeases", testDHCPLeases},
		{"DHCPLeaseRace", testDHCPLeaseRace},
		{"Instances", testInstances},
		{"Heartbeats", testHeartbeats},
		{"UpdatedBefore", testUpdatedBefore},
		{"HeartbeatBatch", testHeartbeatBatch},
		{"HeartbeatBatchesOutOfOrder", testHeartbeatBatchesOutOfOrder},
		{"HeartbeatDuplicates", testHeartbeatDuplicates},
		{"Tokens", testTokens},
		{"TokenRace", testTokenRace},
		{"Certificates", testCertificates},
		{"Tasks", testTasks},
		{"TaskClaimRace", testTaskClaimRace},
		{"TaskLeaseExpiry", testTaskLeaseExpiry},
		{"InstancesWithAgentWork", testInstancesWithAgentWork},
		{"Events", testEvents},
		{"Pools", testPools},
		{"PoolClaimRace", testPoolClaimRace},
		{"PoolBatchClaim", testPoolBatchClaim},
		{"Presence", testPresence},
		{"ClaimNeedsPresence", testClaimNeedsPresence},
		{"TxRollback", testTxRollback},
		{"Notifications", testNotifications},
		{"EventsInChunks", testEventsInChunks},
		{"Elector", testElector},
		{"PruneRecords", testPruneRecords},
		{"Trust", testTrust},
		{"Credentials", testCredentials},
		{"Authorities", testAuthorities},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			t.Cleanup(func() { s.Close() })
			tc.fn(t, s)
		})
	}
}

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func wantErr(t *testing.T, err, sentinel error) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("got error %v, want %v", err, sentinel)
	}
}

func seedModule(t testing.TB, s store.Store, name, version string) *store.Module {
	m := &store.Module{Name: name, Version: version, Digest: "sha256:" + fmt.Sprintf("%064x", len(name)+len(version)), Size: 4096, CreatedAt: t0}
	must(t, s.CreateModule(ctx(t), m))
	return m
}

func seedTemplate(t testing.TB, s store.Store, name string) *store.Template {
	seedModule(t, s, name+"-base", "1")
	tpl := &store.Template{Name: name, RootModules: []store.ModuleRef{{Name: name + "-base", Version: "1"}}, CreatedAt: t0, UpdatedAt: t0}
	must(t, s.CreateTemplate(ctx(t), tpl))
	return tpl
}

func seedNode(t testing.TB, s store.Store, name string) *store.Node {
	tpl := seedTemplate(t, s, name+"-tpl")
	n := &store.Node{Name: name, TemplateID: tpl.ID, Enabled: true, Config: []byte(`{"owner":"ops"}`), CreatedAt: t0, UpdatedAt: t0}
	must(t, s.CreateNode(ctx(t), n))
	return n
}

func ref(name, version string) store.ModuleRef {
	return store.ModuleRef{Name: name, Version: version}
}

func newInstance(nodeID store.NodeID, status lifecycle.State) *store.Instance {
	return &store.Instance{NodeID: nodeID, Status: status, Provider: "fake", CreatedAt: t0, UpdatedAt: t0}
}

func testTemplates(t *testing.T, s store.Store) {
	c := ctx(t)
	seedModule(t, s, "base", "1")
	seedModule(t, s, "base", "2")
	seedModule(t, s, "tools", "1")
	tpl := &store.Template{
		Name:             "web",
		RootModules:      []store.ModuleRef{ref("base", "1"), ref("tools", "1")},
		ExtensionModules: []store.ModuleRef{ref("base", "2")},
		KernelArgs:       "quiet", Console: "ttyS1,115200n8", CreatedAt: t0, UpdatedAt: t0,
	}
	must(t, s.CreateTemplate(c, tpl))
	if tpl.ID == "" {
		t.Fatal("CreateTemplate did not assign an id")
	}
	wantErr(t, s.CreateTemplate(c, &store.Template{Name: "web", CreatedAt: t0, UpdatedAt: t0}), store.ErrAlreadyExists)

	got, err := s.GetTemplate(c, "web")
	must(t, err)
	if len(got.RootModules) != 2 || got.RootModules[0] != (ref("base", "1")) || got.RootModules[1] != (ref("tools", "1")) {
		t.Fatalf("root modules out of order: %+v", got.RootModules)
	}
	if len(got.ExtensionModules) != 1 || got.KernelArgs != "quiet" || got.Console != "ttyS1,115200n8" || !got.CreatedAt.Equal(t0) {
		t.Fatalf("template read back wrong: %+v", got)
	}
	byID, err := s.GetTemplateByID(c, tpl.ID)
	must(t, err)
	if byID.Name != "web" {
		t.Fatalf("GetTemplateByID: %+v", byID)
	}

	// A reference to a module that does not exist is refused.
	bad := &store.Template{Name: "bad", RootModules: []store.ModuleRef{ref("nope", "1")}, CreatedAt: t0, UpdatedAt: t0}
	if err := s.Tx(c, func(q store.Queries) error { return q.CreateTemplate(c, bad) }); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("template with a missing module: got %v, want ErrConflict", err)
	}
	if _, err := s.GetTemplate(c, "bad"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused template was half-written: %v", err)
	}

	got.RootModules = []store.ModuleRef{ref("base", "2")}
	got.ExtensionModules = nil
	got.KernelArgs = "debug"
	got.Console = "none"
	must(t, s.UpdateTemplate(c, got))
	got2, err := s.GetTemplate(c, "web")
	must(t, err)
	if len(got2.RootModules) != 1 || got2.RootModules[0].Version != "2" || len(got2.ExtensionModules) != 0 || got2.KernelArgs != "debug" || got2.Console != "none" {
		t.Fatalf("update not applied: %+v", got2)
	}

	for i := 0; i < 5; i++ {
		must(t, s.CreateTemplate(c, &store.Template{Name: "t" + strconv.Itoa(i), CreatedAt: t0, UpdatedAt: t0}))
	}
	page1, err := s.ListTemplates(c, store.Page{Limit: 3})
	must(t, err)
	page2, err := s.ListTemplates(c, store.Page{Limit: 3, After: page1[len(page1)-1].Name})
	must(t, err)
	if len(page1) != 3 || len(page2) != 3 || page2[0].Name <= page1[2].Name {
		t.Fatalf("paging broken: %d then %d", len(page1), len(page2))
	}

	// A template in use by a node cannot be deleted.
	must(t, s.CreateNode(c, &store.Node{Name: "n1", TemplateID: tpl.ID, Enabled: true, CreatedAt: t0, UpdatedAt: t0}))
	wantErr(t, s.DeleteTemplate(c, "web"), store.ErrConflict)
	must(t, s.DeleteNode(c, "n1"))
	must(t, s.DeleteTemplate(c, "web"))
	wantErr(t, s.DeleteTemplate(c, "web"), store.ErrNotFound)
	_, err = s.GetTemplate(c, "web")
	wantErr(t, err, store.ErrNotFound)
}

func testModules(t *testing.T, s store.Store) {
	c := ctx(t)
	m := &store.Module{Name: "base", Version: "1.0", Digest: "sha256:" + fmt.Sprintf("%064d", 1), Size: 1 << 20, Signature: []byte{1, 2, 3}, CreatedAt: t0}
	must(t, s.CreateModule(c, m))
	wantErr(t, s.CreateModule(c, m), store.ErrAlreadyExists)
	got, err := s.GetModule(c, "base", "1.0")
	must(t, err)
	if got.Digest != m.Digest || got.Size != m.Size || string(got.Signature) != string(m.Signature) {
		t.Fatalf("module read back wrong: %+v", got)
	}
	_, err = s.GetModule(c, "base", "2.0")
	wantErr(t, err, store.ErrNotFound)

	same := &store.Module{Name: "alias", Version: "1", Digest: m.Digest, Size: m.Size, CreatedAt: t0}
	must(t, s.CreateModule(c, same))
	n, err := s.CountModulesWithDigest(c, m.Digest)
	must(t, err)
	if n != 2 {
		t.Fatalf("CountModulesWithDigest = %d, want 2", n)
	}
	list, err := s.ListModules(c, "base", store.Page{})
	must(t, err)
	if len(list) != 1 {
		t.Fatalf("ListModules(base) = %d, want 1", len(list))
	}
	all, err := s.ListModules(c, "", store.Page{})
	must(t, err)
	if len(all) != 2 || all[0].Name != "alias" {
		t.Fatalf("ListModules() = %+v", all)
	}

	must(t, s.CreateTemplate(c, &store.Template{Name: "uses-base", RootModules: []store.ModuleRef{ref("base", "1.0")}, CreatedAt: t0, UpdatedAt: t0}))
	err = s.DeleteModule(c, "base", "1.0")
	wantErr(t, err, store.ErrConflict)
	must(t, s.DeleteModule(c, "alias", "1"))
	wantErr(t, s.DeleteModule(c, "alias", "1"), store.ErrNotFound)
}

func testNodes(t *testing.T, s store.Store) {
	c := ctx(t)
	tpl := seedTemplate(t, s, "tpl")
	n := &store.Node{Name: "edge-1", TemplateID: tpl.ID, Enabled: true, Config: []byte(`{"rack":"a"}`), PublicAddress: "192.0.2.1", CreatedAt: t0, UpdatedAt: t0}
	must(t, s.CreateNode(c, n))
	wantErr(t, s.CreateNode(c, &store.Node{Name: "edge-1", TemplateID: tpl.ID, CreatedAt: t0, UpdatedAt: t0}), store.ErrAlreadyExists)
	got, err := s.GetNode(c, "edge-1")
	must(t, err)
	if got.ID != n.ID || string(got.Config) != `{"rack":"a"}` || !got.Enabled || got.PublicAddress != "192.0.2.1" {
		t.Fatalf("node read back wrong: %+v", got)
	}
	got.Enabled = false
	got.Config = []byte(`{}`)
	must(t, s.UpdateNode(c, got))
	got2, err := s.GetNodeByID(c, n.ID)
	must(t, err)
	if got2.Enabled || string(got2.Config) != `{}` {
		t.Fatalf("update not applied: %+v", got2)
	}
	list, err := s.ListNodes(c, store.NodeFilter{TemplateID: tpl.ID}, store.Page{})
	must(t, err)
	if len(list) != 1 {
		t.Fatalf("ListNodes = %d", len(list))
	}
	// NodeNames answers many ids at once (more than one chunk) and leaves
	// unknown ones out.
	ids := []store.NodeID{n.ID, "no-such-node"}
	for i := 0; i < 600; i++ {
		extra := &store.Node{Name: fmt.Sprintf("bulk-%03d", i), TemplateID: tpl.ID, Config: []byte(`{}`), CreatedAt: t0, UpdatedAt: t0}
		must(t, s.CreateNode(c, extra))
		ids = append(ids, extra.ID)
	}
	names, err := s.NodeNames(c, ids)
	must(t, err)
	if len(names) != 601 || names[n.ID] != "edge-1" || names[ids[len(ids)-1]] != "bulk-599" {
		t.Fatalf("NodeNames: %d names, edge-1=%q, last=%q", len(names), names[n.ID], names[ids[len(ids)-1]])
	}
	if _, ok := names["no-such-node"]; ok {
		t.Fatal("NodeNames invented a name for an unknown id")
	}
	if empty, err := s.NodeNames(c, nil); err != nil || len(empty) != 0 {
		t.Fatalf("NodeNames(nil) = %v, %v", empty, err)
	}

	// A node with a live instance cannot be deleted; once it is terminated it can.
	in := newInstance(n.ID, lifecycle.Running)
	must(t, s.CreateInstance(c, in))
	wantErr(t, s.DeleteNode(c, "edge-1"), store.ErrConflict)
	in.Status = lifecycle.Terminated
	must(t, s.UpdateInstance(c, in))
	must(t, s.DeleteNode(c, "edge-1"))
	_, err = s.GetInstance(c, in.ID)
	wantErr(t, err, store.ErrNotFound)
}

func testNodeMACs(t *testing.T, s store.Store) {
	c := ctx(t)
	tpl := seedTemplate(t, s, "tpl")
	a := &store.Node{Name: "rack1-07", TemplateID: tpl.ID, MACs: []string{"52:54:00:00:00:02", "52:54:00:00:00:01"}, CreatedAt: t0, UpdatedAt: t0}
	must(t, s.Tx(c, func(q store.Queries) error { return q.CreateNode(c, a) }))
	got, err := s.GetNodeByMAC(c, "52:54:00:00:00:01")
	must(t, err)
	if got.ID != a.ID || strings.Join(got.MACs, ",") != "52:54:00:00:00:02,52:54:00:00:00:01" {
		t.Fatalf("GetNodeByMAC = %+v, want rack1-07 with its addresses in order", got)
	}
	_, err = s.GetNodeByMAC(c, "52:54:00:00:00:09")
	wantErr(t, err, store.ErrNotFound)

	// An address of another node is refused, names that node, and leaves nothing behind.
	b := &store.Node{Name: "rack1-08", TemplateID: tpl.ID, MACs: []string{"52:54:00:00:00:03", "52:54:00:00:00:02"}, CreatedAt: t0, UpdatedAt: t0}
	err = s.Tx(c, func(q store.Queries) error { return q.CreateNode(c, b) })
	wantErr(t, err, store.ErrAlreadyExists)
	var inUse *store.MACInUseError
	if !errors.As(err, &inUse) || inUse.Node != "rack1-07" || inUse.MAC != "52:54:00:00:00:02" {
		t.Fatalf("CreateNode with a taken address: %v, want MACInUseError naming rack1-07", err)
	}
	_, err = s.GetNode(c, "rack1-08")
	wantErr(t, err, store.ErrNotFound)
	_, err = s.GetNodeByMAC(c, "52:54:00:00:00:03")
	wantErr(t, err, store.ErrNotFound)

	// Without addresses, then given some: UpdateNode replaces the set.
	b.MACs = nil
	must(t, s.CreateNode(c, b))
	b.MACs = []string{"52:54:00:00:00:01"}
	err = s.Tx(c, func(q store.Queries) error { return q.UpdateNode(c, b) })
	if !errors.As(err, &inUse) || inUse.Node != "rack1-07" {
		t.Fatalf("UpdateNode with a taken address: %v", err)
	}
	a.MACs = []string{"52:54:00:00:00:02"}
	must(t, s.Tx(c, func(q store.Queries) error { return q.UpdateNode(c, a) }))
	must(t, s.Tx(c, func(q store.Queries) error { return q.UpdateNode(c, b) }))
	got, err = s.GetNodeByMAC(c, "52:54:00:00:00:01")
	must(t, err)
	if got.Name != "rack1-08" {
		t.Fatalf("address moved to %q, want rack1-08", got.Name)
	}
	// A node keeps its own addresses across an update of other fields.
	must(t, s.Tx(c, func(q store.Queries) error { return q.UpdateNode(c, a) }))
	list, err := s.ListNodes(c, store.NodeFilter{}, store.Page{})
	must(t, err)
	if len(list) != 2 || strings.Join(list[0].MACs, ",") != "52:54:00:00:00:02" || strings.Join(list[1].MACs, ",") != "52:54:00:00:00:01" {
		t.Fatalf("ListNodes addresses wrong: %+v %+v", list[0], list[1])
	}
	// Deleting a node frees its addresses.
	must(t, s.Tx(c, func(q store.Queries) error { return q.DeleteNode(c, "rack1-08") }))
	_, err = s.GetNodeByMAC(c, "52:54:00:00:00:01")
	wantErr(t, err, store.ErrNotFound)
	b2 := &store.Node{Name: "rack1-09", TemplateID: tpl.ID, MACs: []string{"52:54:00:00:00:01"}, CreatedAt: t0, UpdatedAt: t0}
	must(t, s.Tx(c, func(q store.Queries) error { return q.CreateNode(c, b2) }))
}

func testDHCPLeases(t *testing.T, s store.Store) {
	c := ctx(t)
	l := &store.DHCPLease{IP: "10.213.0.10", MAC: "52:54:00:00:00:01", ExpiresAt: t0.Add(time.Hour), UpdatedAt: t0}
	must(t, s.CreateDHCPLease(c, l))
	// One address per machine, one machine per address.
	wantErr(t, s.CreateDHCPLease(c, &store.DHCPLease{IP: "10.213.0.10", MAC: "52:54:00:00:00:02", ExpiresAt: t0, UpdatedAt: t0}), store.ErrAlreadyExists)
	wantErr(t, s.CreateDHCPLease(c, &store.DHCPLease{IP: "10.213.0.11", MAC: "52:54:00:00:00:01", ExpiresAt: t0, UpdatedAt: t0}), store.ErrAlreadyExists)
	l.ExpiresAt = t0.Add(2 * time.Hour)
	must(t, s.UpdateDHCPLease(c, l))
	got, err := s.GetDHCPLeaseByMAC(c, l.MAC)
	must(t, err)
	if got.IP != l.IP || !got.ExpiresAt.Equal(l.ExpiresAt) {
		t.Fatalf("lease read back wrong: %+v", got)
	}
	if byIP, err := s.GetDHCPLeaseByIP(c, l.IP); err != nil || byIP.MAC != l.MAC {
		t.Fatalf("GetDHCPLeaseByIP = %+v, %v", byIP, err)
	}
	_, err = s.GetDHCPLeaseByIP(c, "10.213.0.99")
	wantErr(t, err, store.ErrNotFound)
	// An update must name the lease's own machine.
	wantErr(t, s.UpdateDHCPLease(c, &store.DHCPLease{IP: l.IP, MAC: "52:54:00:00:00:02", ExpiresAt: t0, UpdatedAt: t0}), store.ErrNotFound)
	must(t, s.CreateDHCPLease(c, &store.DHCPLease{IP: "10.213.0.11", MAC: "52:54:00:00:00:02", ExpiresAt: t0, UpdatedAt: t0}))
	all, err := s.ListDHCPLeases(c)
	must(t, err)
	if len(all) != 2 || all[0].IP != "10.213.0.10" {
		t.Fatalf("ListDHCPLeases = %+v", all)
	}
	must(t, s.DeleteDHCPLease(c, "10.213.0.10"))
	_, err = s.GetDHCPLeaseByMAC(c, l.MAC)
	wantErr(t, err, store.ErrNotFound)
}

func testInstances(t *testing.T, s store.Store) {
	c := ctx(t)
	n := seedNode(t, s, "n")
	hb := t0.Add(time.Minute)
	in := &store.Instance{
		NodeID: n.ID, Status: lifecycle.Pending, Provider: "qemu", Region: "local", InstanceType: "small", OperationID: "op-1",
		CreatedAt: t0, UpdatedAt: t0,
		Holds:       store.Holds{Hold: true, HoldReason: "ops", Cordon: &store.Cordon{By: "alice", Reason: "disk", At: t0, PoolStateBefore: lifecycle.PoolReady}},
		AgentReport: store.AgentReport{LastHeartbeatAt: &hb, AgentPhase: "pulling", RunningModules: []string{"sha256:aa", "sha256:bb"}, Addresses: []string{"10.0.2.15"}},
	}
	must(t, s.CreateInstance(c, in))
	got, err := s.GetInstance(c, in.ID)
	must(t, err)
	if got.OperationID != "op-1" || !got.Hold || got.Cordon == nil || got.Cordon.By != "alice" || !got.Cordon.At.Equal(t0) ||
		got.LastHeartbeatAt == nil || !got.LastHeartbeatAt.Equal(hb) || len(got.RunningModules) != 2 || got.Addresses[0] != "10.0.2.15" {
		t.Fatalf("instance read back wrong: %+v", got)
	}
	// operation_id is unique; instances without one do not collide.
	dup := newInstance(n.ID, lifecycle.Pending)
	dup.OperationID = "op-1"
	wantErr(t, s.CreateInstance(c, dup), store.ErrAlreadyExists)
	must(t, s.CreateInstance(c, newInstance(n.ID, lifecycle.Pending)))
	must(t, s.CreateInstance(c, newInstance(n.ID, lifecycle.Running)))
	byOp, err := s.GetInstanceByOperationID(c, "op-1")
	must(t, err)
	if byOp.ID != in.ID {
		t.Fatal("GetInstanceByOperationID returned another instance")
	}

	must(t, s.Tx(c, func(q store.Queries) error {
		locked, err := q.LockInstance(c, in.ID)
		if err != nil {
			return err
		}
		locked.Status = lifecycle.Provisioning
		locked.Cordon = nil
		locked.TerminateRequestedAt = &hb
		locked.UpdatedAt = hb
		return q.UpdateInstance(c, locked)
	}))
	got, err = s.GetInstance(c, in.ID)
	must(t, err)
	if got.Status != lifecycle.Provisioning || got.Cordon != nil || got.TerminateRequestedAt == nil || !got.CreatedAt.Equal(t0) {
		t.Fatalf("update not applied: %+v", got)
	}
	if st, err := s.InstanceStatus(c, in.ID); err != nil || st != lifecycle.Provisioning {
		t.Fatalf("InstanceStatus = %q, %v; want provisioning", st, err)
	}
	_, err = s.InstanceStatus(c, "no-such-instance")
	wantErr(t, err, store.ErrNotFound)
	if node, st, err := s.InstanceNode(c, in.ID); err != nil || st != lifecycle.Provisioning || node != in.NodeID {
		t.Fatalf("InstanceNode = %q, %q, %v; want %s, provisioning", node, st, err, in.NodeID)
	}
	_, _, err = s.InstanceNode(c, "no-such-instance")
	wantErr(t, err, store.ErrNotFound)

	pending, err := s.ListInstances(c, store.InstanceFilter{Statuses: []lifecycle.State{lifecycle.Pending}}, store.Page{})
	must(t, err)
	if len(pending) != 1 {
		t.Fatalf("ListInstances(pending) = %d, want 1", len(pending))
	}
	count, err := s.CountInstances(c, store.InstanceFilter{NodeID: n.ID})
	must(t, err)
	if count != 3 {
		t.Fatalf("CountInstances = %d, want 3", count)
	}
	intent, err := s.ListInstances(c, store.InstanceFilter{TerminateRequested: true}, store.Page{})
	must(t, err)
	if len(intent) != 1 || intent[0].ID != in.ID {
		t.Fatalf("TerminateRequested filter: %d", len(intent))
	}
	_, err = s.GetInstance(c, "missing")
	wantErr(t, err, store.ErrNotFound)
	wantErr(t, s.UpdateInstance(c, &store.Instance{ID: "missing", NodeID: n.ID, Status: lifecycle.Running}), store.ErrNotFound)
	// A state outside the lifecycle is refused before it reaches a row.
	bad := *in
	bad.Status = "exploded"
	wantErr(t, s.UpdateInstance(c, &bad), lifecycle.ErrUnknownState)
	bad.Status, bad.PoolState = lifecycle.Running, "floating"
	wantErr(t, s.UpdateInstance(c, &bad), lifecycle.ErrUnknownPoolState)
	bad.ID, bad.PoolState = "", lifecycle.NoPool
	bad.Status = "exploded"
	wantErr(t, s.CreateInstance(c, &bad), lifecycle.ErrUnknownState)
	_, err = s.ListInstances(c, store.InstanceFilter{Statuses: []lifecycle.State{"exploded"}}, store.Page{})
	wantErr(t, err, lifecycle.ErrUnknownState)
}

func testHeartbeats(t *testing.T, s store.Store) {
	c := ctx(t)
	n := seedNode(t, s, "n")
	a, b := newInstance(n.ID, lifecycle.Running), newInstance(n.ID, lifecycle.Running)
	silent := t0
	a.SilentSince = &silent
	must(t, s.CreateInstance(c, a))
	must(t, s.CreateInstance(c, b))
	at := t0.Add(time.Hour)
	must(t, s.Tx(c, func(q store.Queries) error {
		return q.RecordHeartbeats(c, []store.Heartbeat{
			{InstanceID: a.ID, At: at, Phase: "ready", AgentVersion: "v1", RunningModules: []string{"sha256:aa"}, BootID: "boot-1"},
			{InstanceID: b.ID, At: at, Phase: "pulling", AgentError: "digest mismatch"},
		})
	}))
	got, err := s.GetInstance(c, a.ID)
	must(t, err)
	if got.LastHeartbeatAt == nil || !got.LastHeartbeatAt.Equal(at) || got.AgentPhase != "ready" || got.SilentSince != nil || got.BootID != "boot-1" {
		t.Fatalf("heartbeat not recorded: %+v", got)
	}
	// An older heartbeat (from a slower batch) does not move time backwards.
	must(t, s.RecordHeartbeats(c, []store.Heartbeat{{InstanceID: a.ID, At: t0, Phase: "pulling"}}))
	got, err = s.GetInstance(c, a.ID)
	must(t, err)
	if !got.LastHeartbeatAt.Equal(at) || got.AgentPhase != "ready" {
		t.Fatalf("older heartbeat overwrote a newer one: %+v", got)
	}
	stale, err := s.ListInstances(c, store.InstanceFilter{HeartbeatBefore: ptr(at.Add(time.Minute))}, store.Page{})
	must(t, err)
	if len(stale) != 2 {
		t.Fatalf("HeartbeatBefore filter = %d, want 2", len(stale))
	}
	fresh, err := s.ListInstances(c, store.InstanceFilter{HeartbeatBefore: ptr(at)}, store.Page{})
	must(t, err)
	if len(fresh) != 0 {
		t.Fatalf("HeartbeatBefore(at) = %d, want 0", len(fresh))
	}
}

// UpdatedBefore selects rows by their last change, and a heartbeat is
// not a change: the liveness loop's boot timeout rests on both.
func testUpdatedBefore(t *testing.T, s store.Store) {
	c := ctx(t)
	n := seedNode(t, s, "n")
	old, recent, other := newInstance(n.ID, lifecycle.Provisioning), newInstance(n.ID, lifecycle.Provisioning), newInstance(n.ID, lifecycle.Running)
	recent.UpdatedAt = t0.Add(time.Hour)
	for _, in := range []*store.Instance{old, recent, other} {
		must(t, s.CreateInstance(c, in))
	}
	must(t, s.RecordHeartbeats(c, []store.Heartbeat{{InstanceID: old.ID, At: t0.Add(2 * time.Hour), Phase: "pulling"}}))
	cases := []struct {
		name   string
		filter store.InstanceFilter
		want   []store.InstanceID
	}{
		{"before both", store.InstanceFilter{UpdatedBefore: ptr(t0)}, nil},
		{"between", store.InstanceFilter{UpdatedBefore: ptr(t0.Add(time.Minute)), Statuses: []lifecycle.State{lifecycle.Provisioning}}, []store.InstanceID{old.ID}},
		{"after both", store.InstanceFilter{UpdatedBefore: ptr(t0.Add(2 * time.Hour)), Statuses: []lifecycle.State{lifecycle.Provisioning}}, []store.InstanceID{old.ID, recent.ID}},
		{"any status", store.InstanceFilter{UpdatedBefore: ptr(t0.Add(time.Minute))}, []store.InstanceID{old.ID, other.ID}},
		// The switch timeout reads instances by the phase the heartbeat set.
		{"agent phase", store.InstanceFilter{AgentPhase: "pulling"}, []store.InstanceID{old.ID}},
		{"another agent phase", store.InstanceFilter{AgentPhase: "switching"}, nil},
	}
	for _, tc := range cases {
		got, err := s.ListInstances(c, tc.filter, store.Page{})
		must(t, err)
		var ids []store.InstanceID
		for _, in := range got {
			ids = append(ids, in.ID)
		}
		slices.Sort(ids)
		want := slices.Clone(tc.want)
		slices.Sort(want)
		if !slices.Equal(ids, want) {
			t.Errorf("%s: got %v, want %v", tc.name, ids, want)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func testTokens(t *testing.T, s store.Store) {
	c := ctx(t)
	must(t, s.CreateToken(c, &store.Token{Hash: "h1", InstanceID: "i1", ExpiresAt: t0.Add(24 * time.Hour), CreatedAt: t0}))
	must(t, s.CreateToken(c, &store.Token{Hash: "h2", InstanceID: "i1", ExpiresAt: t0.Add(time.Hour), CreatedAt: t0}))
	must(t, s.CreateToken(c, &store.Token{Hash: "h3", InstanceID: "i2", ExpiresAt: t0.Add(time.Hour), CreatedAt: t0}))

	tok, err := s.ConsumeToken(c, "h1", "sha256:k1", t0.Add(time.Minute))
	must(t, err)
	if tok.InstanceID != "i1" || tok.UsedAt == nil || tok.SpentKey != "sha256:k1" {
		t.Fatalf("consumed token: %+v", tok)
	}
	tok, err = s.ConsumeToken(c, "h1", "sha256:k2", t0.Add(2*time.Minute))
	wantErr(t, err, store.ErrConflict)
	wantErr(t, err, store.ErrTokenUsed)
	if tok == nil || tok.InstanceID != "i1" || tok.SpentKey != "sha256:k1" {
		t.Fatalf("a reused token must still name its instance and the key it was spent for: %+v", tok)
	}
	if got, err := s.GetToken(c, "h1"); err != nil || got.SpentKey != "sha256:k1" || !got.UsedAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("spent token read back: %+v, %v", got, err)
	}
	_, err = s.ConsumeToken(c, "h2", "sha256:k1", t0.Add(2*time.Hour))
	wantErr(t, err, store.ErrTokenExpired)
	_, err = s.ConsumeToken(c, "nope", "sha256:k1", t0)
	wantErr(t, err, store.ErrNotFound)

	n, err := s.ExpireInstanceTokens(c, "i2", t0.Add(time.Minute))
	must(t, err)
	if n != 1 {
		t.Fatalf("ExpireInstanceTokens = %d, want 1", n)
	}
	_, err = s.ConsumeToken(c, "h3", "", t0.Add(2*time.Minute))
	wantErr(t, err, store.ErrTokenExpired)
}

// testTokenRace: many concurrent consumers of one token, exactly one wins.
// testDHCPLeaseRace: replicas that both saw an address free and both
// lease it: exactly one lease is kept, the other writer is told.
func testDHCPLeaseRace(t *testing.T, s store.Store) {
	c := ctx(t)
	var wins, lost int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.Tx(c, func(q store.Queries) error {
				if _, err := q.GetDHCPLeaseByIP(c, "10.213.0.10"); !errors.Is(err, store.ErrNotFound) {
					return store.Errorf(store.ErrAlreadyExists, "seen taken: %v", err)
				}
				return q.CreateDHCPLease(c, &store.DHCPLease{IP: "10.213.0.10", MAC: fmt.Sprintf("52:54:00:00:01:%02x", i), ExpiresAt: t0, UpdatedAt: t0})
			})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				wins++
			case errors.Is(err, store.ErrAlreadyExists):
				lost++
			default:
				t.Errorf("unexpected error: %v", err)
			}
		}()
	}
	wg.Wait()
	all, err := s.ListDHCPLeases(c)
	must(t, err)
	if wins != 1 || lost != 15 || len(all) != 1 {
		t.Fatalf("wins=%d lost=%d leases=%d, want 1, 15 and 1", wins, lost, len(all))
	}
}

func testTokenRace(t *testing.T, s store.Store) {
	c := ctx(t)
	must(t, s.CreateToken(c, &store.Token{Hash: "race", InstanceID: "i1", ExpiresAt: t0.Add(time.Hour), CreatedAt: t0}))
	var wins, used int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.Tx(c, func(q store.Queries) error {
				_, err := q.ConsumeToken(c, "race", "", t0)
				return err
			})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				wins++
			case errors.Is(err, store.ErrTokenUsed):
				used++
			default:
				t.Errorf("unexpected error: %v", err)
			}
		}()
	}
	wg.Wait()
	if wins != 1 || used != 15 {
		t.Fatalf("wins=%d used=%d, want 1 and 15", wins, used)
	}
}

func testCertificates(t *testing.T, s store.Store) {
	c := ctx(t)
	for i, cert := range []store.Certificate{
		{Serial: "01", InstanceID: "i1", Kind: store.CertKindNode, NotBefore: t0, NotAfter: t0.Add(24 * time.Hour)},
		{Serial: "02", InstanceID: "i1", Kind: store.CertKindNode, NotBefore: t0, NotAfter: t0.Add(24 * time.Hour)},
		{Serial: "03", InstanceID: "i2", Kind: store.CertKindNode, NotBefore: t0, NotAfter: t0.Add(time.Hour)},
		{Serial: "04", Kind: store.CertKindAdmin, Subject: "admin", NotBefore: t0, NotAfter: t0.Add(365 * 24 * time.Hour)},
	} {
		cert.CreatedAt = t0.Add(time.Duration(i) * time.Second)
		must(t, s.CreateCertificate(c, &cert))
	}
	wantErr(t, s.CreateCertificate(c, &store.Certificate{Serial: "01", NotBefore: t0, NotAfter: t0, CreatedAt: t0}), store.ErrAlreadyExists)

	got, err := s.RevokeCertificate(c, "03", "compromised", t0.Add(time.Minute))
	must(t, err)
	if got.RevokedAt == nil || got.RevokeReason != "compromised" {
		t.Fatalf("revoke: %+v", got)
	}
	again, err := s.RevokeCertificate(c, "03", "again", t0.Add(time.Hour))
	must(t, err)
	if !again.RevokedAt.Equal(*got.RevokedAt) || again.RevokeReason != "compromised" {
		t.Fatal("revoking twice must keep the first revocation")
	}
	_, err = s.RevokeCertificate(c, "99", "x", t0)
	wantErr(t, err, store.ErrNotFound)

	serials, err := s.RevokeInstanceCertificates(c, "i1", "terminated", t0.Add(time.Minute))
	must(t, err)
	slices.Sort(serials)
	if len(serials) != 2 || serials[0] != "01" {
		t.Fatalf("RevokeInstanceCertificates = %v", serials)
	}
	// Revoked and unexpired at t0+30m: 01, 02, 03. At t0+2h, 03 has expired.
	revoked, err := s.ListRevokedSerials(c, t0.Add(30*time.Minute))
	must(t, err)
	if len(revoked) != 3 {
		t.Fatalf("ListRevokedSerials = %v", revoked)
	}
	revoked, err = s.ListRevokedSerials(c, t0.Add(2*time.Hour))
	must(t, err)
	if len(revoked) != 2 {
		t.Fatalf("ListRevokedSerials after expiry = %v", revoked)
	}
	list, err := s.ListCertificates(c, store.CertificateFilter{InstanceID: "i1"}, store.Page{})
	must(t, err)
	if len(list) != 2 {
		t.Fatalf("ListCertificates(i1) = %d", len(list))
	}
	// An admin identity's certificates are found by their subject.
	must(t, s.CreateCertificate(c, &store.Certificate{Serial: "05", Kind: store.CertKindAdmin, Subject: "admin", NotBefore: t0, NotAfter: t0.Add(time.Hour), CreatedAt: t0}))
	must(t, s.CreateCertificate(c, &store.Certificate{Serial: "06", Kind: store.CertKindAdmin, Subject: "other", NotBefore: t0, NotAfter: t0.Add(time.Hour), CreatedAt: t0}))
	list, err = s.ListCertificates(c, store.CertificateFilter{Subject: "admin"}, store.Page{})
	must(t, err)
	if len(list) != 2 || list[0].Serial != "04" || list[1].Serial != "05" {
		t.Fatalf("ListCertificates(subject admin) = %+v", list)
	}
}

func newTask(instanceID store.InstanceID, target store.TaskTarget, at time.Time) *store.Task {
	return &store.Task{Target: target, InstanceID: instanceID, Kind: "exec", Payload: []byte(`{"argv":["true"]}`),
		Status: store.TaskPending, MaxAttempts: 3, CreatedAt: at, UpdatedAt: at}
}

func testTasks(t *testing.T, s store.Store) {
	c := ctx(t)
	first := newTask("i1", store.TaskTargetAgent, t0)
	must(t, s.CreateTask(c, first))
	second := newTask("i1", store.TaskTargetAgent, t0.Add(time.Second))
	must(t, s.CreateTask(c, second))
	must(t, s.CreateTask(c, newTask("i2", store.TaskTargetAgent, t0)))
	must(t, s.CreateTask(c, newTask("i1", store.TaskTargetWorker, t0)))

	claim := store.TaskClaim{Target: store.TaskTargetAgent, InstanceID: "i1", Owner: "agent:i1", Now: t0, LeaseUntil: t0.Add(time.Minute)}
	got, err := s.ClaimTask(c, claim)
	must(t, err)
	if got.ID != first.ID || got.Status != store.TaskLeased || got.LeaseOwner != "agent:i1" || got.LeaseExpiresAt == nil {
		t.Fatalf("claim took the wrong task or did not lease it: %+v", got)
	}
	// Claim by id.
	byID := claim
	byID.TaskID = second.ID
	got, err = s.ClaimTask(c, byID)
	must(t, err)
	if got.ID != second.ID {
		t.Fatal("claim by id took another task")
	}
	_, err = s.ClaimTask(c, claim)
	wantErr(t, err, store.ErrNotFound)

	exit := 3
	got.Status, got.ExitCode, got.Output, got.OutputTruncated, got.UpdatedAt = store.TaskSucceeded, &exit, []byte("hello\n"), true, t0.Add(time.Minute)
	must(t, s.UpdateTask(c, got))
	back, err := s.GetTask(c, second.ID)
	must(t, err)
	if back.Status != store.TaskSucceeded || back.ExitCode == nil || *back.ExitCode != 3 || string(back.Output) != "hello\n" || !back.OutputTruncated || !back.Terminal() {
		t.Fatalf("task read back wrong: %+v", back)
	}
	list, err := s.ListTasks(c, store.TaskFilter{InstanceID: "i1", Target: store.TaskTargetAgent}, store.Page{})
	must(t, err)
	if len(list) != 2 {
		t.Fatalf("ListTasks = %d", len(list))
	}
	list, err = s.ListTasks(c, store.TaskFilter{Statuses: []store.TaskStatus{store.TaskPending}}, store.Page{})
	must(t, err)
	if len(list) != 2 {
		t.Fatalf("ListTasks(pending) = %d", len(list))
	}
}

// testInstancesWithAgentWork: the sweep lists each instance with a pending
// agent task or a cancellation to relay, once, and nothing else.
func testInstancesWithAgentWork(t *testing.T, s store.Store) {
	c := ctx(t)
	add := func(instance store.InstanceID, target store.TaskTarget, status store.TaskStatus, cancel bool) {
		tk := newTask(instance, target, t0)
		tk.Status, tk.CancelRequested = status, cancel
		if status == store.TaskLeased || status == store.TaskRunning {
			until := t0.Add(time.Minute)
			tk.LeaseOwner, tk.LeaseExpiresAt = "agent:"+instance.String(), &until
		}
		must(t, s.CreateTask(c, tk))
	}
	got, err := s.ListInstancesWithAgentWork(c)
	must(t, err)
	if len(got) != 0 {
		t.Fatalf("no tasks, yet %v have work", got)
	}
	add("pending", store.TaskTargetAgent, store.TaskPending, false)
	add("pending-twice", store.TaskTargetAgent, store.TaskPending, false)
	add("pending-twice", store.TaskTargetAgent, store.TaskPending, false)
	add("worker-only", store.TaskTargetWorker, store.TaskPending, false)
	add("leased", store.TaskTargetAgent, store.TaskLeased, false)
	add("running-cancel", store.TaskTargetAgent, store.TaskRunning, true)
	add("leased-cancel", store.TaskTargetAgent, store.TaskLeased, true)
	add("done", store.TaskTargetAgent, store.TaskSucceeded, false)
	got, err = s.ListInstancesWithAgentWork(c)
	must(t, err)
	slices.Sort(got)
	if want := []store.InstanceID{"leased-cancel", "pending", "pending-twice", "running-cancel"}; !slices.Equal(got, want) {
		t.Fatalf("instances with agent work = %v, want %v", got, want)
	}
	// What each instance's stream sees on connect.
	add("both", store.TaskTargetAgent, store.TaskPending, false)
	add("both", store.TaskTargetAgent, store.TaskRunning, true)
	add("both", store.TaskTargetAgent, store.TaskLeased, true)
	add("both", store.TaskTargetAgent, store.TaskRunning, false)
	add("both", store.TaskTargetWorker, store.TaskRunning, true)
	add("both", store.TaskTargetAgent, store.TaskSucceeded, true)
	for _, tc := range []struct {
		instance store.InstanceID
		pending  bool
		cancels  int
	}{
		{"pending", true, 0},
		{"pending-twice", true, 0},
		{"worker-only", false, 0},
		{"leased", false, 0},
		{"running-cancel", false, 1},
		{"leased-cancel", false, 1},
		{"done", false, 0},
		{"both", true, 2},
		{"nobody", false, 0},
	} {
		pending, cancels, err := s.AgentWork(c, tc.instance)
		must(t, err)
		if pending != tc.pending || len(cancels) != tc.cancels {
			t.Errorf("AgentWork(%s) = pending %v, %d cancels; want %v, %d", tc.instance, pending, len(cancels), tc.pending, tc.cancels)
		}
		for _, k := range cancels {
			if k.InstanceID != tc.instance || !k.CancelRequested || k.Target != store.TaskTargetAgent || (k.Status != store.TaskLeased && k.Status != store.TaskRunning) {
				t.Errorf("AgentWork(%s) cancel %+v: not a cancel-requested agent task of it", tc.instance, k)
			}
		}
	}
}

// testTaskClaimRace: 64 concurrent claimers over 200 tasks never lease the
// same task twice, and every task is leased exactly once.
func testTaskClaimRace(t *testing.T, s store.Store) {
	c := ctx(t)
	const tasks, claimers = 200, 64
	for i := 0; i < tasks; i++ {
		must(t, s.CreateTask(c, newTask("i1", store.TaskTargetWorker, t0.Add(time.Duration(i)*time.Millisecond))))
	}
	seen := map[store.TaskID]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := 0; w < claimers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			owner := "worker-" + strconv.Itoa(w)
			for {
				var got *store.Task
				err := s.Tx(c, func(q store.Queries) error {
					var err error
					got, err = q.ClaimTask(c, store.TaskClaim{Target: store.TaskTargetWorker, Owner: owner, Now: t0, LeaseUntil: t0.Add(time.Minute)})
					return err
				})
				if errors.Is(err, store.ErrNotFound) {
					return
				}
				if err != nil {
					t.Errorf("claim: %v", err)
					return
				}
				mu.Lock()
				if prev, dup := seen[got.ID]; dup {
					t.Errorf("task %s leased twice: to %s and %s", got.ID, prev, owner)
				}
				seen[got.ID] = owner
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	if len(seen) != tasks {
		t.Fatalf("%d tasks leased, want %d", len(seen), tasks)
	}
}

func testTaskLeaseExpiry(t *testing.T, s store.Store) {
	c := ctx(t)
	tk := newTask("i1", store.TaskTargetAgent, t0)
	tk.MaxAttempts = 2
	must(t, s.CreateTask(c, tk))
	claim := store.TaskClaim{Target: store.TaskTargetAgent, InstanceID: "i1", Owner: "a", Now: t0, LeaseUntil: t0.Add(time.Minute)}

	_, err := s.ClaimTask(c, claim)
	must(t, err)
	// Not yet expired.
	changed, err := s.ExpireTaskLeases(c, t0.Add(30*time.Second))
	must(t, err)
	if len(changed) != 0 {
		t.Fatalf("expired a live lease: %+v", changed)
	}
	changed, err = s.ExpireTaskLeases(c, t0.Add(2*time.Minute))
	must(t, err)
	if len(changed) != 1 || changed[0].Status != store.TaskPending || changed[0].Attempts != 1 {
		t.Fatalf("first expiry: %+v", changed)
	}
	_, err = s.ClaimTask(c, claim)
	must(t, err)
	changed, err = s.ExpireTaskLeases(c, t0.Add(2*time.Minute))
	must(t, err)
	if len(changed) != 1 || changed[0].Status != store.TaskFailed || changed[0].Attempts != 2 || changed[0].ErrorMessage == "" {
		t.Fatalf("second expiry must fail the task with a reason: %+v", changed)
	}
	_, err = s.ClaimTask(c, claim)
	wantErr(t, err, store.ErrNotFound)
}

func testEvents(t *testing.T, s store.Store) {
	c := ctx(t)
	kinds := []struct {
		kind     store.EventKind
		sev      store.Severity
		instance store.InstanceID
		pool     store.PoolID
		corr     store.CorrelationID
	}{
		{"instance.silent", store.SeverityMedium, "i1", "", ""},
		{"pool.claimed", store.SeverityLow, "i1", "p1", "claim-1"},
		{"pool.released", store.SeverityLow, "i1", "p1", "claim-1"},
		{"enroll.token_reused", store.SeverityHigh, "i2", "", ""},
	}
	for i, k := range kinds {
		e := &store.Event{Kind: k.kind, Severity: k.sev, InstanceID: k.instance, PoolID: k.pool, CorrelationID: k.corr,
			Payload: []byte(`{"n":` + strconv.Itoa(i) + `}`), CreatedAt: t0.Add(time.Duration(i) * 24 * time.Hour)}
		must(t, s.AppendEvent(c, e))
		if e.ID == 0 {
			t.Fatal("AppendEvent did not assign an id")
		}
	}
	all, err := s.ListEvents(c, store.EventFilter{}, store.Page{})
	must(t, err)
	if len(all) != 4 || all[0].Kind != "enroll.token_reused" || all[3].Kind != "instance.silent" {
		t.Fatalf("ListEvents must be newest first: %v", kindsOf(all))
	}
	for _, tc := range []struct {
		f    store.EventFilter
		want int
	}{
		{store.EventFilter{Kind: "pool.claimed"}, 1},
		{store.EventFilter{InstanceID: "i1"}, 3},
		{store.EventFilter{PoolID: "p1"}, 2},
		{store.EventFilter{CorrelationID: "claim-1"}, 2},
		{store.EventFilter{MinSeverity: store.SeverityHigh}, 1},
		{store.EventFilter{InstanceID: "i1", Kind: "pool.released"}, 1},
	} {
		got, err := s.ListEvents(c, tc.f, store.Page{})
		must(t, err)
		if len(got) != tc.want {
			t.Errorf("ListEvents(%+v) = %d, want %d", tc.f, len(got), tc.want)
		}
	}
	page, err := s.ListEvents(c, store.EventFilter{}, store.Page{Limit: 2, After: strconv.FormatInt(all[1].ID, 10)})
	must(t, err)
	if len(page) != 2 || page[0].ID != all[2].ID {
		t.Fatalf("event paging: %v", kindsOf(page))
	}
	since, err := s.ListEventsSince(c, store.EventFilter{}, all[2].ID, 10)
	must(t, err)
	if len(since) != 2 || since[0].ID != all[1].ID {
		t.Fatalf("ListEventsSince must be oldest first after the id: %v", kindsOf(since))
	}
	latest, err := s.LatestEventID(c)
	must(t, err)
	if latest != all[0].ID {
		t.Fatalf("LatestEventID = %d, want %d", latest, all[0].ID)
	}
	// Low/medium older than day 2 go; the high one (day 3) stays until its own window.
	// In batches: a limit of one deletes one, and the next batch the rest.
	for _, b := range []struct {
		limit int
		want  int64
	}{{1, 1}, {5, 1}, {0, 0}} {
		n, err := s.PruneEvents(c, t0.Add(36*time.Hour), t0.Add(48*time.Hour), b.limit)
		must(t, err)
		if n != b.want {
			t.Fatalf("PruneEvents(limit %d) = %d, want %d", b.limit, n, b.want)
		}
	}
	left, err := s.ListEvents(c, store.EventFilter{}, store.Page{})
	must(t, err)
	if len(left) != 2 {
		t.Fatalf("after prune: %v", kindsOf(left))
	}
}

func kindsOf(es []*store.Event) []store.EventKind {
	var out []store.EventKind
	for _, e := range es {
		out = append(out, e.Kind)
	}
	return out
}

func seedPool(t *testing.T, s store.Store, name string) *store.Pool {
	tpl := seedTemplate(t, s, name+"-tpl")
	retention := 3
	p := &store.Pool{Name: name, TemplateID: tpl.ID, Provider: "fake", LifecycleClass: store.ClassEphemeral, TargetSize: 2, MaxSize: 12,
		Status: store.PoolActive, Metadata: store.PoolMetadata{ReadyTTLSeconds: 60, RecordRetentionDays: &retention}, CreatedAt: t0, UpdatedAt: t0}
	must(t, s.CreatePool(ctx(t), p))
	return p
}

func addMembers(t *testing.T, s store.Store, p *store.Pool, nodeID store.NodeID, state lifecycle.PoolState, n int) []*store.Instance {
	var out []*store.Instance
	for i := 0; i < n; i++ {
		in := newInstance(nodeID, lifecycle.Running)
		in.PoolID, in.PoolState = p.ID, state
		w := t0.Add(time.Duration(i) * time.Second)
		in.PoolWarmingStartedAt = &w
		must(t, s.CreateInstance(ctx(t), in))
		// Present for the length of any test: a claim needs its agent there.
		must(t, s.OpenPresence(ctx(t), &store.Presence{InstanceID: in.ID, Replica: "storetest", StreamID: "s-" + in.ID.String(),
			ConnectedAt: t0, LeaseUntil: t0.Add(365 * 24 * time.Hour)}))
		out = append(out, in)
	}
	return out
}

func testPools(t *testing.T, s store.Store) {
	c := ctx(t)
	p := seedPool(t, s, "ci")
	wantErr(t, s.CreatePool(c, &store.Pool{Name: "ci", TemplateID: p.TemplateID, Status: store.PoolActive, CreatedAt: t0, UpdatedAt: t0}), store.ErrAlreadyExists)
	got, err := s.GetPool(c, "ci")
	must(t, err)
	if got.Metadata.ReadyTTLSeconds != 60 || got.Metadata.RecordRetentionDays == nil || *got.Metadata.RecordRetentionDays != 3 || got.MaxSize != 12 {
		t.Fatalf("pool read back wrong: %+v", got)
	}
	got.Status = store.PoolPaused
	now := t0.Add(time.Hour)
	got.LastReplenishedAt = &now
	must(t, s.UpdatePool(c, got))
	back, err := s.GetPoolByID(c, p.ID)
	must(t, err)
	if back.Status != store.PoolPaused || back.LastReplenishedAt == nil {
		t.Fatalf("pool update not applied: %+v", back)
	}
	list, err := s.ListPools(c, store.Page{})
	must(t, err)
	if len(list) != 1 {
		t.Fatalf("ListPools = %d", len(list))
	}

	n := seedNode(t, s, "member")
	addMembers(t, s, p, n.ID, lifecycle.PoolReady, 2)
	addMembers(t, s, p, n.ID, lifecycle.PoolWarming, 1)
	addMembers(t, s, p, n.ID, lifecycle.PoolErrored, 1)
	gone := addMembers(t, s, p, n.ID, lifecycle.PoolReady, 1)[0]
	gone.Status = lifecycle.Terminated
	must(t, s.UpdateInstance(c, gone))
	counts, err := s.CountPoolMembers(c, p.ID)
	must(t, err)
	if counts != (store.PoolCounts{Ready: 2, Warming: 1, Errored: 1}) {
		t.Fatalf("CountPoolMembers = %+v", counts)
	}
	// A paused pool hands out nothing.
	_, err = s.ClaimPoolMember(c, p.ID, "", t0)
	wantErr(t, err, store.ErrNotFound)
	back.Status = store.PoolActive
	must(t, s.UpdatePool(c, back))
	m, err := s.ClaimPoolMember(c, p.ID, "", t0)
	must(t, err)
	if m.PoolWarmingStartedAt == nil || !m.PoolWarmingStartedAt.Equal(t0) {
		t.Fatal("ClaimPoolMember must take the oldest ready member")
	}
	_, err = s.ClaimPoolMember(c, "", store.ClassSpot, t0)
	wantErr(t, err, store.ErrNotFound)
	_, err = s.ClaimPoolMember(c, "", store.ClassEphemeral, t0)
	must(t, err)

	wantErr(t, s.DeletePool(c, p.ID), store.ErrConflict)

	// Pruning takes only a dead member's row.
	must(t, s.DeletePoolMember(c, gone.ID))
	_, err = s.GetInstance(c, gone.ID)
	wantErr(t, err, store.ErrNotFound)
	wantErr(t, s.DeletePoolMember(c, m.ID), store.ErrConflict)
	wantErr(t, s.DeletePoolMember(c, "no-such-instance"), store.ErrNotFound)
}

// testPoolBatchClaim: ClaimPoolMembers takes the oldest ready members in
// order and writes each its own claim; AppendEvents keeps ids in order.
func testPoolBatchClaim(t *testing.T, s store.Store) {
	c := ctx(t)
	p := seedPool(t, s, "batch")
	n := seedNode(t, s, "member")
	ready := addMembers(t, s, p, n.ID, lifecycle.PoolReady, 3)
	at := t0.Add(time.Hour)
	cs := []store.PoolClaim{{ClaimID: "c1", AcquiredBy: "a"}, {ClaimID: "c2", AcquiredBy: "b", AcquiredFor: "x"}}
	var got []*store.Instance
	must(t, s.Tx(c, func(q store.Queries) error {
		var err error
		got, err = q.ClaimPoolMembers(c, p.ID, "", cs, at)
		if err != nil {
			return err
		}
		return q.AppendEvents(c, []*store.Event{{Kind: "k1", Severity: 1, CorrelationID: "c1", CreatedAt: at},
			{Kind: "k2", Severity: 1, CorrelationID: "c2", CreatedAt: at}})
	}))
	if len(got) != 2 || got[0].ID != ready[0].ID || got[1].ID != ready[1].ID {
		t.Fatalf("ClaimPoolMembers took %d members, not the two oldest in order", len(got))
	}
	for i, want := range cs {
		back, err := s.GetInstance(c, got[i].ID)
		must(t, err)
		if back.PoolState != lifecycle.PoolClaimed || back.ClaimID != want.ClaimID || back.AcquiredBy != want.AcquiredBy ||
			back.AcquiredFor != want.AcquiredFor || back.PoolAcquiredAt == nil || !back.PoolAcquiredAt.Equal(at) {
			t.Fatalf("claimed member %d read back: %+v", i, back)
		}
	}
	evs, err := s.ListEvents(c, store.EventFilter{}, store.Page{})
	must(t, err)
	if len(evs) != 2 || evs[0].Kind != "k2" || evs[1].Kind != "k1" || evs[0].ID <= evs[1].ID || evs[0].CorrelationID != "c2" {
		t.Fatalf("AppendEvents order: %v", kindsOf(evs))
	}
	more, err := s.ClaimPoolMembers(c, p.ID, "", []store.PoolClaim{{ClaimID: "c3"}, {ClaimID: "c4"}}, at)
	must(t, err)
	if len(more) != 1 || more[0].ID != ready[2].ID || more[0].ClaimID != "c3" {
		t.Fatalf("second batch: %d members", len(more))
	}
	_, err = s.ClaimPoolMembers(c, p.ID, "", []store.PoolClaim{{ClaimID: "c5"}}, at)
	wantErr(t, err, store.ErrNotFound)
}

// testPoolClaimRace: 32 claimers, 20 ready members: exactly 20 distinct claims.
func testPoolClaimRace(t *testing.T, s store.Store) {
	c := ctx(t)
	p := seedPool(t, s, "race")
	n := seedNode(t, s, "member")
	addMembers(t, s, p, n.ID, lifecycle.PoolReady, 20)
	var mu sync.Mutex
	claimed := map[store.InstanceID]bool{}
	exhausted := 0
	var wg sync.WaitGroup
	for i := 0; i < 32; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var id store.InstanceID
			err := s.Tx(c, func(q store.Queries) error {
				m, err := q.ClaimPoolMember(c, p.ID, "", t0)
				if err != nil {
					return err
				}
				m.PoolState = lifecycle.PoolClaimed
				id = m.ID
				return q.UpdateInstance(c, m)
			})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				if claimed[id] {
					t.Errorf("member %s claimed twice", id)
				}
				claimed[id] = true
			case errors.Is(err, store.ErrNotFound):
				exhausted++
			default:
				t.Errorf("claim: %v", err)
			}
		}()
	}
	wg.Wait()
	if len(claimed) != 20 || exhausted != 12 {
		t.Fatalf("claims=%d exhausted=%d, want 20 and 12", len(claimed), exhausted)
	}
}

func testTxRollback(t *testing.T, s store.Store) {
	c := ctx(t)
	boom := errors.New("boom")
	err := s.Tx(c, func(q store.Queries) error {
		if err := q.CreateToken(c, &store.Token{Hash: "rolled", InstanceID: "i", ExpiresAt: t0.Add(time.Hour), CreatedAt: t0}); err != nil {
			return err
		}
		if err := q.AppendEvent(c, &store.Event{Kind: "x", Severity: 1, CreatedAt: t0}); err != nil {
			return err
		}
		return boom
	})
	wantErr(t, err, boom)
	_, err = s.GetToken(c, "rolled")
	wantErr(t, err, store.ErrNotFound)
	evs, err := s.ListEvents(c, store.EventFilter{}, store.Page{})
	must(t, err)
	if len(evs) != 0 {
		t.Fatal("a rolled-back event was kept")
	}
}

func testNotifications(t *testing.T, s store.Store) {
	c := ctx(t)
	ch, stop := s.Subscribe(store.ChannelTasks)
	defer stop()
	// A rolled-back transaction sends nothing.
	_ = s.Tx(c, func(q store.Queries) error {
		if err := q.Notify(c, store.ChannelTasks, "rolled-back"); err != nil {
			return err
		}
		return errors.New("abort")
	})
	must(t, s.Tx(c, func(q store.Queries) error { return q.Notify(c, store.ChannelTasks, "i-42") }))
	select {
	case got := <-ch:
		if got != "i-42" {
			t.Fatalf("got notification %q, want i-42 (a rolled-back one leaked?)", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no notification after commit")
	}
	// Autocommit notifications and events arrive too.
	evs, stopEv := s.Subscribe(store.ChannelEvents)
	defer stopEv()
	e := &store.Event{Kind: "k", Severity: 1, CreatedAt: t0}
	must(t, s.AppendEvent(c, e))
	select {
	case got := <-evs:
		if got != strconv.FormatInt(e.ID, 10) {
			t.Fatalf("event notification %q, want %d", got, e.ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event notification")
	}
}

// testEventsInChunks: more events in one transaction than one INSERT
// carries get ids in the order they were appended, and the transaction's
// notification names the last.
func testEventsInChunks(t *testing.T, s store.Store) {
	c := ctx(t)
	ch, stop := s.Subscribe(store.ChannelEvents)
	defer stop()
	es := make([]*store.Event, 2001)
	for i := range es {
		es[i] = &store.Event{Kind: store.EventKind("k" + strconv.Itoa(i)), Severity: 1, CreatedAt: t0}
	}
	single := &store.Event{Kind: "single", Severity: 1, CreatedAt: t0}
	must(t, s.Tx(c, func(q store.Queries) error {
		if err := q.AppendEvents(c, es[:1500]); err != nil {
			return err
		}
		if err := q.AppendEvent(c, single); err != nil {
			return err
		}
		return q.AppendEvents(c, es[1500:])
	}))
	all := append(append(append([]*store.Event{}, es[:1500]...), single), es[1500:]...)
	for i := 1; i < len(all); i++ {
		if all[i].ID <= all[i-1].ID {
			t.Fatalf("event %d (%s) got id %d, not above %d of the one appended before it", i, all[i].Kind, all[i].ID, all[i-1].ID)
		}
	}
	var back []*store.Event
	for after := all[0].ID - 1; ; {
		page, err := s.ListEventsSince(c, store.EventFilter{}, after, store.MaxPageSize)
		must(t, err)
		if len(page) == 0 {
			break
		}
		back, after = append(back, page...), page[len(page)-1].ID
	}
	if len(back) != len(all) || back[0].Kind != all[0].Kind || back[1500].Kind != "single" || back[len(back)-1].Kind != all[len(all)-1].Kind {
		t.Fatalf("read back %d of %d events, or out of order", len(back), len(all))
	}
	last := strconv.FormatInt(all[len(all)-1].ID, 10)
	for {
		select {
		case got := <-ch:
			if got == last {
				return
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no notification naming the last id %s", last)
		}
	}
}

func testElector(t *testing.T, s store.Store) {
	c := ctx(t)
	lead, release, err := s.Elector().Campaign(c, "loop")
	must(t, err)
	if lead.Err() != nil {
		t.Fatal("leadership context already done")
	}
	// A second campaign waits while the first leads.
	waitCtx, cancel := context.WithTimeout(c, 200*time.Millisecond)
	defer cancel()
	if _, _, err := s.Elector().Campaign(waitCtx, "loop"); err == nil {
		t.Fatal("two leaders of one loop")
	}
	release()
	if lead.Err() == nil {
		t.Fatal("release must end the leadership context")
	}
	_, release2, err := s.Elector().Campaign(c, "loop")
	must(t, err)
	release2()
}

func testPruneRecords(t *testing.T, s store.Store) {
	c := ctx(t)
	old, recent := t0.Add(-60*24*time.Hour), t0
	done := newTask("i1", store.TaskTargetAgent, old)
	done.Status, done.UpdatedAt = store.TaskSucceeded, old
	must(t, s.CreateTask(c, done))
	done2 := newTask("i1", store.TaskTargetAgent, old)
	done2.Status, done2.UpdatedAt = store.TaskCancelled, old
	must(t, s.CreateTask(c, done2))
	running := newTask("i1", store.TaskTargetAgent, old)
	running.Status, running.UpdatedAt = store.TaskRunning, old
	must(t, s.CreateTask(c, running))
	fresh := newTask("i1", store.TaskTargetAgent, recent)
	fresh.Status = store.TaskFailed
	must(t, s.CreateTask(c, fresh))
	must(t, s.CreateToken(c, &store.Token{Hash: "old", InstanceID: "i1", ExpiresAt: old, CreatedAt: old}))
	must(t, s.CreateToken(c, &store.Token{Hash: "live", InstanceID: "i1", ExpiresAt: recent.Add(time.Hour), CreatedAt: recent}))
	must(t, s.CreateCertificate(c, &store.Certificate{Serial: "old", InstanceID: "i1", Kind: store.CertKindNode, NotBefore: old, NotAfter: old.Add(24 * time.Hour), CreatedAt: old}))
	must(t, s.CreateCertificate(c, &store.Certificate{Serial: "live", InstanceID: "i1", Kind: store.CertKindNode, NotBefore: recent, NotAfter: recent.Add(24 * time.Hour), CreatedAt: recent}))

	cut := t0.Add(-30 * 24 * time.Hour)
	// A batch of one takes one of the two old finished tasks; the next
	// batch the other.
	for _, b := range []struct {
		limit int
		want  store.Pruned
	}{{1, store.Pruned{Tasks: 1, Tokens: 1, Certificates: 1}}, {0, store.Pruned{Tasks: 1}}, {0, store.Pruned{}}} {
		p, err := s.PruneRecords(c, cut, cut, cut, b.limit)
		must(t, err)
		if p != b.want {
			t.Fatalf("PruneRecords(limit %d) = %+v, want %+v", b.limit, p, b.want)
		}
	}
	for _, id := range []store.TaskID{done.ID, done2.ID} {
		if _, err := s.GetTask(c, id); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("old finished task %s survived", id)
		}
	}
	for _, id := range []store.TaskID{running.ID, fresh.ID} {
		if _, err := s.GetTask(c, id); err != nil {
			t.Fatalf("task %s must stay (unfinished or recent): %v", id, err)
		}
	}
	if _, err := s.GetToken(c, "live"); err != nil {
		t.Fatalf("a live token was pruned: %v", err)
	}
	if _, err := s.GetCertificate(c, "live"); err != nil {
		t.Fatalf("a live certificate was pruned: %v", err)
	}
}

// The CA rotation set: one prepared and one active at most, state moves
// only from the state named, and live certificates counted per issuer.
func testAuthorities(t *testing.T, s store.Store) {
	c := ctx(t)
	ca := func(fp, state string) *store.Authority {
		return &store.Authority{Fingerprint: fp, CertPEM: "pem " + fp, State: state, NotAfter: t0.Add(time.Hour), CreatedAt: t0, UpdatedAt: t0}
	}
	must(t, s.CreateAuthority(c, ca("a", store.AuthorityActive)))
	b := ca("b", store.AuthorityPrepared)
	b.KeySealed, b.CrossPEM, b.CreatedAt = []byte{1, 2, 3}, "cross", t0.Add(time.Second)
	must(t, s.CreateAuthority(c, b))
	wantErr(t, s.CreateAuthority(c, ca("c", store.AuthorityPrepared)), store.ErrAlreadyExists)
	wantErr(t, s.CreateAuthority(c, ca("d", store.AuthorityActive)), store.ErrAlreadyExists)
	got, err := s.ListAuthorities(c)
	must(t, err)
	if len(got) != 2 || got[0].Fingerprint != "a" || got[0].State != store.AuthorityActive || len(got[0].KeySealed) != 0 ||
		got[1].Fingerprint != "b" || string(got[1].KeySealed) != "\x01\x02\x03" || got[1].CrossPEM != "cross" ||
		!got[1].NotAfter.Equal(t0.Add(time.Hour)) {
		t.Fatalf("authorities = %+v", got)
	}
	wantErr(t, s.SetAuthorityState(c, "b", store.AuthorityActive, store.AuthorityOld, t0), store.ErrConflict)
	wantErr(t, s.SetAuthorityState(c, "zz", store.AuthorityActive, store.AuthorityOld, t0), store.ErrNotFound)
	// Activation in one transaction: the active first, then the prepared.
	must(t, s.Tx(c, func(q store.Queries) error {
		if err := q.SetAuthorityState(c, "a", store.AuthorityActive, store.AuthorityOld, t0); err != nil {
			return err
		}
		return q.SetAuthorityState(c, "b", store.AuthorityPrepared, store.AuthorityActive, t0)
	}))
	got, err = s.ListAuthorities(c)
	must(t, err)
	if got[0].State != store.AuthorityOld || got[1].State != store.AuthorityActive {
		t.Fatalf("after activation: %s %s", got[0].State, got[1].State)
	}

	for i, cert := range []store.Certificate{
		{Serial: "c1", Kind: store.CertKindNode, NotAfter: t0.Add(time.Hour)},
		{Serial: "c2", Kind: store.CertKindNode, NotAfter: t0.Add(time.Hour), Issuer: "b"},
		{Serial: "c3", Kind: store.CertKindNode, NotAfter: t0.Add(-time.Hour), Issuer: "b"},
		{Serial: "c4", Kind: store.CertKindNode, NotAfter: t0.Add(time.Hour), Issuer: "b"},
	} {
		cert.NotBefore, cert.CreatedAt = t0.Add(-2*time.Hour), t0.Add(time.Duration(i))
		must(t, s.CreateCertificate(c, &cert))
	}
	_, err = s.RevokeCertificate(c, "c4", "test", t0)
	must(t, err)
	n, err := s.AssignCertificateIssuer(c, "a")
	must(t, err)
	if n != 1 {
		t.Fatalf("assigned %d, want 1", n)
	}
	counts, err := s.CountLiveCertificates(c, t0)
	must(t, err)
	if len(counts) != 2 || counts["a"] != 1 || counts["b"] != 1 {
		t.Fatalf("live certificates = %v, want a:1 b:1", counts)
	}
	if got, err := s.GetCertificate(c, "c2"); err != nil || got.Issuer != "b" {
		t.Fatalf("c2 = %+v, %v", got, err)
	}
}
