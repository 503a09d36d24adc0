package api_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/daemon"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/fake"
)

// Each death signal moves the row within seconds, by what the provider
// observes, with provider sync and the silence thresholds far away: a
// provider's exit report, and a stream that drops while the machine is
// gone. A stream that drops while the machine runs (a partitioned agent)
// leaves the row running and shows the agent disconnected.
func TestDeathSignalsMoveTheRowByWhatTheProviderObserves(t *testing.T) {
	logs := &logBuffer{}
	fp := fake.New()
	cp := lifecycleCP(t, logs, func(o *daemon.ServeOptions) {
		o.Loops.ProviderSyncEvery = time.Hour
		o.Liveness.SilentAfter, o.Liveness.PresumedDeadAfter = time.Hour, 2*time.Hour
	}, fp)
	ctx := ctxT(t)
	boot1 := func(name string) (*v1.Instance, context.CancelFunc) {
		t.Helper()
		f := cp.SeedFleet(ctx, name)
		_, in := provisionFake(t, cp, f.Node)
		sctx, cancel := context.WithCancel(ctx)
		boot(t, sctx, cp, fp, in)
		return in, cancel
	}
	crashed, _ := boot1("crashed")
	vanished, dropVanished := boot1("vanished")
	partitioned, dropPartitioned := boot1("partitioned")

	got := waitInstance(t, cp, partitioned.Id, func(in *v1.Instance) bool { return in.GetAgentPresence().GetConnected() })
	if got.AgentPresence.Replica == "" || got.AgentPresence.LostAt != nil {
		t.Fatalf("a connected agent's presence: %+v", got.AgentPresence)
	}

	// The provider reports the exit (a reaped QEMU child): asked at once.
	fp.Crash(crashed.CloudInstanceId, "qemu killed by signal 9 (killed, exit status 137)")
	got = waitInstance(t, cp, crashed.Id, func(in *v1.Instance) bool { return in.Status == v1.InstanceStatus_INSTANCE_STATUS_ERROR })
	if !strings.Contains(got.ErrorMessage, "machine exited outside Tether (qemu killed by signal 9") {
		t.Fatalf("crashed: error message %q", got.ErrorMessage)
	}

	// The machine is gone and its stream drops.
	fp.Vanish(vanished.CloudInstanceId)
	dropVanished()
	got = waitInstance(t, cp, vanished.Id, func(in *v1.Instance) bool { return in.Status == v1.InstanceStatus_INSTANCE_STATUS_ERROR })
	if !strings.Contains(got.ErrorMessage, "machine gone") {
		t.Fatalf("vanished: error message %q", got.ErrorMessage)
	}

	// The stream drops but the machine runs: disconnected, still running.
	dropPartitioned()
	got = waitInstance(t, cp, partitioned.Id, func(in *v1.Instance) bool {
		return in.AgentPresence != nil && !in.AgentPresence.Connected && in.AgentPresence.LostAt != nil
	})
	if got.Status != v1.InstanceStatus_INSTANCE_STATUS_RUNNING {
		t.Fatalf("a partitioned agent whose machine runs went %v", got.Status)
	}
	if st, _ := fp.Status(ctx, partitioned.CloudInstanceId); st.State != providers.StateRunning {
		t.Fatalf("fake machine %v", st.State)
	}
}
