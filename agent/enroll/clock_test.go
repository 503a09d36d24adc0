package enroll

import (
	"sync"
	"time"

	"github.com/tetherfleet/tether/internal/clock"
)

// fakeClock is a manual clock. With auto set, After fires at once and moves
// the clock forward by d, so retry loops run without real waiting.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	auto    bool
	waiters []waiter
	waitsCh chan time.Duration
}

type waiter struct {
	at time.Time
	ch chan time.Time
}

func newFakeClock(now time.Time) *fakeClock {
	return &fakeClock{now: now, waitsCh: make(chan time.Duration, 100)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if c.auto || d <= 0 {
		c.now = c.now.Add(max(d, 0))
		ch <- c.now
		return ch
	}
	c.waiters = append(c.waiters, waiter{at: c.now.Add(d), ch: ch})
	select {
	case c.waitsCh <- d:
	default:
	}
	return ch
}

// Advance moves the clock and fires the waiters that are due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if !w.at.After(c.now) {
			w.ch <- c.now
		} else {
			kept = append(kept, w)
		}
	}
	c.waiters = kept
}

// The code under test waits only through After; the other clock.Clock
// methods fail loudly rather than fall back to real time.
func (*fakeClock) NewTimer(time.Duration) clock.Timer { panic("fakeClock: NewTimer not supported") }
func (*fakeClock) NewTicker(time.Duration) clock.Ticker {
	panic("fakeClock: NewTicker not supported")
}
func (*fakeClock) AfterFunc(time.Duration, func()) clock.Timer {
	panic("fakeClock: AfterFunc not supported")
}
