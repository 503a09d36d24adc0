package api_test

import (
	"strings"
	"testing"

	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// TestInstanceViewShowsModuleRAM: the view sums the sizes of the running
// modules the template names, once each; a digest it does not name is
// not counted.
func TestInstanceViewShowsModuleRAM(t *testing.T) {
	cp := testcp.Start(t)
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "ram")
	tpl, err := cp.Admin.GetTemplate(ctx, &v1.GetTemplateRequest{Name: fleet.Template})
	if err != nil {
		t.Fatal(err)
	}
	base := tpl.RootModules[0]
	in, cert := enrolled(t, cp, fleet.Node)
	s, _ := connect(t, ctx, cp, cert)
	other := "sha256:" + strings.Repeat("ab", 32)
	if err := s.Send(&v1.AgentMessage{Msg: &v1.AgentMessage_Heartbeat{Heartbeat: &v1.Heartbeat{
		Phase: v1.AgentPhase_AGENT_PHASE_PULLING, RunningModuleDigests: []string{base.Digest, other}}}}); err != nil {
		t.Fatal(err)
	}
	got := waitInstance(t, cp, in.Id, func(i *v1.Instance) bool { return len(i.RunningModuleDigests) == 2 })
	if got.ModuleRamBytes != base.Size || base.Size == 0 {
		t.Fatalf("module RAM = %d, want the base module's %d", got.ModuleRamBytes, base.Size)
	}
}

// TestBootFailedHeartbeatErrorsTheInstance: an agent that gave up its
// boot errors its instance at once with its words, over the wire.
func TestBootFailedHeartbeatErrorsTheInstance(t *testing.T) {
	cp := testcp.Start(t)
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "gaveup")
	in, cert := enrolled(t, cp, fleet.Node)
	s, _ := connect(t, ctx, cp, cert)
	const msg = "the node's memory cannot hold its modules: root layers 900.0 MiB"
	if err := s.Send(&v1.AgentMessage{Msg: &v1.AgentMessage_Heartbeat{Heartbeat: &v1.Heartbeat{
		Phase: v1.AgentPhase_AGENT_PHASE_DISCOVERING, Error: msg, BootFailed: true}}}); err != nil {
		t.Fatal(err)
	}
	got := waitInstance(t, cp, in.Id, func(i *v1.Instance) bool { return i.Status == v1.InstanceStatus_INSTANCE_STATUS_ERROR })
	if !strings.Contains(got.ErrorMessage, "gave up the boot") || !strings.Contains(got.ErrorMessage, "900.0 MiB") {
		t.Fatalf("reason %q", got.ErrorMessage)
	}
}
