package api_test

import (
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/api"
)

// The reconnection window a replica hands its agents grows with the
// agents it holds, so that after a restart they return at most
// MaxReconnectsPerSecond, and stops at a bound well inside the liveness
// thresholds.
func TestReconnectSpread(t *testing.T) {
	for _, tc := range []struct {
		connected int
		want      time.Duration
	}{
		{0, 0},
		{1, 2 * time.Millisecond},
		{500, time.Second},
		{19000, 38 * time.Second},
		{30000, 60 * time.Second},
		{100000, api.MaxReconnectSpread},
	} {
		if got := api.ReconnectSpread(tc.connected); got != tc.want {
			t.Errorf("ReconnectSpread(%d) = %s, want %s", tc.connected, got, tc.want)
		}
	}
}
