package instances_test

import (
	"strings"
	"testing"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
)

// TestAgentGaveUp: an agent that gave up its boot (boot_failed) errors a
// booting instance at once with its words; a running instance only gets
// the error recorded.
func TestAgentGaveUp(t *testing.T) {
	const msg = "the node's memory cannot hold its modules: root layers 900.0 MiB + extensions 0.0 MiB + margin 128.0 MiB = 1028.0 MiB, but only 440.0 MiB of the node's 512.0 MiB is available"
	for _, tc := range []struct {
		name   string
		status lifecycle.State
		want   lifecycle.State
	}{
		{"provisioning", lifecycle.Provisioning, lifecycle.Error},
		{"rebooting", lifecycle.Rebooting, lifecycle.Error},
		{"running is past its boot", lifecycle.Running, lifecycle.Running},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			in := e.provision()
			e.setStatus(in.ID, tc.status)
			if err := e.svc.AgentGaveUp(e.ctx, in.ID, "discovering", msg); err != nil {
				t.Fatal(err)
			}
			got := e.get(in.ID)
			if got.Status != tc.want || got.AgentError != msg {
				t.Fatalf("status %s, agent error %q; want %s with the error recorded", got.Status, got.AgentError, tc.want)
			}
			if tc.want == lifecycle.Error {
				if !strings.Contains(got.ErrorMessage, "gave up the boot") || !strings.Contains(got.ErrorMessage, "440.0 MiB") {
					t.Fatalf("reason %q must carry the agent's words", got.ErrorMessage)
				}
				if !e.hasEvent(in.ID, events.InstanceErrored) {
					t.Fatalf("events %v lack %s", e.eventKinds(in.ID), events.InstanceErrored)
				}
			}
		})
	}
}
