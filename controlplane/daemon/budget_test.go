package daemon

import (
	"syscall"
	"testing"
)

// The agent connection cap leaves the reserve free under the descriptor
// limit, and an explicit cap or "no cap" is kept as given.
func TestConnectionBudget(t *testing.T) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur > 1<<30 {
		t.Skip("SKIPPED: the descriptor limit is unlimited here; the derived cap cannot be checked")
	}
	limit := int(lim.Cur)
	tests := []struct {
		name    string
		in      ServeOptions
		want    int
		wantErr bool
	}{
		{"derived", ServeOptions{}, limit - DefaultFDReserve, false},
		{"derived, own reserve", ServeOptions{Limits: LimitOptions{FDReserve: 100}}, limit - 100, false},
		{"explicit", ServeOptions{Limits: LimitOptions{MaxAgentConnections: 7}}, 7, false},
		{"no cap", ServeOptions{Limits: LimitOptions{MaxAgentConnections: -1}}, -1, false},
		{"reserve eats the limit", ServeOptions{Limits: LimitOptions{FDReserve: limit}}, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.in
			err := o.connectionBudget()
			if tc.wantErr {
				if err == nil {
					t.Fatalf("no error, cap %d", o.Limits.MaxAgentConnections)
				}
				return
			}
			if err != nil || o.Limits.MaxAgentConnections != tc.want || o.Limits.MaxUnauthenticatedPerSource != DefaultMaxUnauthenticatedPerSource {
				t.Fatalf("cap %d, per source %d, %v; want %d, %d", o.Limits.MaxAgentConnections, o.Limits.MaxUnauthenticatedPerSource, err, tc.want, DefaultMaxUnauthenticatedPerSource)
			}
		})
	}
}
