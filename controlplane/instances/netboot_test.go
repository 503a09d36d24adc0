package instances_test

import (
	"strings"
	"testing"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/providers/fake"
)

// netbooter is the fake provider with firmware netboot on.
type netbooter struct{ *fake.Provider }

func (netbooter) Netboots() bool { return true }

// TestNetbootingProvisionGetsAMACAndNoToken: a netbooting machine of a
// node without hardware addresses gets a generated one, recorded on the
// node; no token goes with the boot (the per-boot script carries one).
func TestNetbootingProvisionGetsAMACAndNoToken(t *testing.T) {
	e := newEnv(t)
	e.svc.Machines["netfake"] = netbooter{e.fake}
	res, err := e.svc.Provision(e.ctx, instances.ProvisionParams{Node: e.node.Name, Provider: "netfake"})
	if err != nil {
		t.Fatal(err)
	}
	if ran, err := e.wk.RunOnce(e.ctx); !ran || err != nil {
		t.Fatalf("worker: %v %v", ran, err)
	}
	calls := e.fake.CallsFor(fake.OpProvision)
	if len(calls) != 1 {
		t.Fatalf("%d provision calls", len(calls))
	}
	spec := calls[0].Spec
	if !strings.HasPrefix(spec.MAC, "52:54:00:") || len(spec.MAC) != 17 {
		t.Fatalf("generated MAC %q, want 52:54:00:xx:xx:xx", spec.MAC)
	}
	if spec.Boot.Enrollment.Token != "" {
		t.Fatal("a netbooting machine was handed a token")
	}
	node, err := e.st.GetNodeByID(e.ctx, e.node.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(node.MACs) != 1 || node.MACs[0] != spec.MAC {
		t.Fatalf("node MACs %v, want [%s] recorded", node.MACs, spec.MAC)
	}
	if !e.hasEvent(res.Instance.ID, events.NodeMACGenerated) {
		t.Errorf("no %s event: %v", events.NodeMACGenerated, e.eventKinds(res.Instance.ID))
	}
	if e.hasEvent(res.Instance.ID, events.TokenIssued) {
		t.Errorf("a token was issued for a netbooting machine: %v", e.eventKinds(res.Instance.ID))
	}

}
