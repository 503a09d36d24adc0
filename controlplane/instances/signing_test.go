package instances_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/providers/fake"
)

// A node's signature refusal arrives as its heartbeat error; it is
// recorded under its own kind so operators can watch for it.
func TestAgentSignatureRefusalIsItsOwnEvent(t *testing.T) {
	e := newEnv(t)
	in := e.provision()
	msg := "module.signature_refused: module base:1 refused: node signer anchor: unsigned"
	if err := e.svc.AgentError(e.ctx, in.ID, "pulling", msg); err != nil {
		t.Fatal(err)
	}
	if err := e.svc.AgentError(e.ctx, in.ID, "pulling", "module base:1 digest mismatch"); err != nil {
		t.Fatal(err)
	}
	if !e.hasEvent(in.ID, events.ModuleSignatureRefused) || !e.hasEvent(in.ID, events.InstanceAgentError) {
		t.Fatalf("events = %v, want one %s and one %s", e.eventKinds(in.ID), events.ModuleSignatureRefused, events.InstanceAgentError)
	}
}

// Provisioning (and so a pool's replenish, which provisions the same way)
// refuses a template whose required signers did not sign its modules.
func TestProvisionRefusesModulesTheRequiredSignersDidNotSign(t *testing.T) {
	e := newEnv(t)
	tpl, err := e.st.GetTemplateByID(e.ctx, e.node.TemplateID)
	if err != nil {
		t.Fatal(err)
	}
	fp := "sha256:" + strings.Repeat("ab", 32)
	if err := e.st.CreateModule(e.ctx, &store.Module{Name: "base", Version: "1", Digest: "sha256:" + strings.Repeat("0", 64), Size: 1, CreatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	tpl.RootModules = []store.ModuleRef{{Name: "base", Version: "1"}}
	tpl.RequiredSigners = []string{fp}
	if err := e.st.Tx(e.ctx, func(q store.Queries) error { return q.UpdateTemplate(e.ctx, tpl) }); err != nil {
		t.Fatal(err)
	}
	_, err = e.svc.Provision(e.ctx, instances.ProvisionParams{Node: e.node.Name, Provider: fake.Name})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), fp) ||
		!strings.Contains(err.Error(), "base:1") {
		t.Fatalf("provision = %v, want FailedPrecondition naming the module and %s", err, fp)
	}
	n, err := e.st.CountInstances(e.ctx, store.InstanceFilter{})
	if err != nil || n != 0 {
		t.Fatalf("instances = %d (%v), want none", n, err)
	}
}
