package sqlstore

import (
	"testing"
	"time"
)

// The pause before a re-run grows with each loss, stays random within its
// ceiling (so two victims do not collide again in step), and never passes
// the cap.
func TestRetryDelay(t *testing.T) {
	for _, tc := range []struct {
		attempt int
		ceiling time.Duration
	}{
		{1, 5 * time.Millisecond},
		{2, 10 * time.Millisecond},
		{3, 20 * time.Millisecond},
		{6, 160 * time.Millisecond},
		{7, 250 * time.Millisecond},
		{30, 250 * time.Millisecond},
	} {
		seen := map[time.Duration]bool{}
		for range 200 {
			d := retryDelay(tc.attempt)
			if d < 0 || d > tc.ceiling {
				t.Fatalf("retryDelay(%d) = %s, want within [0, %s]", tc.attempt, d, tc.ceiling)
			}
			seen[d] = true
		}
		if len(seen) < 10 {
			t.Fatalf("retryDelay(%d) took only %d distinct values in 200 draws: not spread", tc.attempt, len(seen))
		}
	}
}
