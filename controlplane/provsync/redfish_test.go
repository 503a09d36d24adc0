package provsync_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/providers/redfish"
	"github.com/tetherfleet/tether/providers/redfish/redfishtest"
)

// oneNode resolves one node to a system of a test BMC.
type oneNode struct{ t redfish.Target }

func (r oneNode) Target(_ context.Context, node string) (redfish.Target, error) {
	if node != r.t.Node {
		return redfish.Target{}, fmt.Errorf("node %s: %w", node, redfish.ErrNoBMC)
	}
	return r.t, nil
}

func (r oneNode) Targets(context.Context) ([]redfish.Target, error) {
	return []redfish.Target{r.t}, nil
}

// A bare-metal machine powered off at its BMC behind Tether's back: the
// provider's next poll (the provider-sync pass) reads PowerState Off and
// moves the running row to error with what it observed, and the member
// leaves ready. While the BMC says On the row stays, whatever the agent
// does (design §2.6, §2.7).
func TestRedfishPowerOffMovesTheRowOnTheNextPoll(t *testing.T) {
	f := setup(t)
	bmc := redfishtest.New(t, redfishtest.Options{Username: "u", Password: "p"})
	m := redfishtest.NewFakeMachine(redfish.PowerOn)
	bmc.AddSystem("1", m)
	rp, err := redfish.New(redfish.Config{Resolver: oneNode{redfish.Target{Node: "bm-1", Address: bmc.Address("1"),
		Username: "u", Password: "p", TLS: redfish.TLS{CAPEM: bmc.CAPEM()}}}})
	if err != nil {
		t.Fatal(err)
	}
	f.syncer.Instances.Machines[redfish.Name] = rp

	in := &store.Instance{NodeID: f.nodeID, Status: lifecycle.Running, Provider: redfish.Name, CloudInstanceID: redfish.MachineID("bm-1"),
		CreatedAt: t0, UpdatedAt: t0}
	if err := f.st.CreateInstance(f.ctx, in); err != nil {
		t.Fatal(err)
	}
	f.member(t, in)

	if res, err := f.syncer.Tick(f.ctx); err != nil || res.Errored != 0 {
		t.Fatalf("a pass while the BMC says On: %+v, %v; want nothing moved", res, err)
	}
	if err := m.PowerOff(f.ctx, false); err != nil {
		t.Fatal(err)
	}
	res, err := f.syncer.Tick(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Errored != 1 {
		t.Fatalf("errored %d rows after the BMC's power-off, want 1", res.Errored)
	}
	got := f.get(t, in.ID)
	if got.Status != lifecycle.Error || !strings.HasPrefix(got.ErrorMessage, "machine exited outside Tether (") ||
		!strings.Contains(got.ErrorMessage, "Off") {
		t.Fatalf("row: %s %q; want error saying the BMC reported it Off", got.Status, got.ErrorMessage)
	}
	if got.PoolState != lifecycle.PoolErrored {
		t.Fatalf("member is %s, want errored (out of ready)", got.PoolState)
	}
	evs := f.events(t, in.ID, events.InstanceErrored)
	if len(evs) != 1 {
		t.Fatalf("%d instance.errored events, want 1", len(evs))
	}
}
