package enroll

import (
	"context"
	"testing"
	"time"

	"github.com/tetherfleet/tether/internal/clock"
)

// fakeClock is internal/clock's fake with the one question these tests
// ask: how long does the code under test wait next.
type fakeClock struct{ *clock.Fake }

func newFakeClock(now time.Time) *fakeClock { return &fakeClock{clock.NewFake(now)} }

// nextWait blocks until the code under test waits and returns for how
// long. The previous wait must have fired or been stopped.
func (c *fakeClock) nextWait(t *testing.T) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var d time.Duration
	if err := c.BlockUntilPending(ctx, func(p []time.Duration) bool {
		if len(p) > 0 {
			d = p[0]
		}
		return len(p) > 0
	}); err != nil {
		t.Fatalf("nothing waits: %v", err)
	}
	return d
}
