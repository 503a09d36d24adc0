package daemon

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
)

// A test's listeners belong to Serve from the start: a step that fails
// before the listeners are opened (here the first, reading the CA) still
// closes them.
func TestServeClosesTheTestListenersWhenTheFirstStepFails(t *testing.T) {
	grpcLis, netLis, metricsLis := listen(t, nil), listen(t, nil), listen(t, nil)
	err := Serve(context.Background(), ServeOptions{DataDir: filepath.Join(t.TempDir(), "never-initialised"),
		Log:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		Test: TestHooks{Listener: grpcLis, NetbootListener: netLis, MetricsListener: metricsLis}})
	if err == nil || !strings.Contains(err.Error(), "tetherd init") {
		t.Fatalf("Serve over a data dir never initialised = %v, want an error pointing at tetherd init", err)
	}
	for name, l := range map[string]*trackedListener{"gRPC": grpcLis, "netboot": netLis, "metrics": metricsLis} {
		if !l.closed.Load() {
			t.Errorf("the %s listener was left open", name)
		}
	}
}
