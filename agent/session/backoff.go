package session

import (
	"math/rand/v2"
	"time"
)

// Backoff computes reconnect delays with "full jitter": attempt n sleeps a
// uniformly random time in [0, min(Cap, Base·2^n)]. Spreading each delay
// over the whole interval, rather than adding a little jitter to a fixed
// delay, is what keeps a thousand agents that lost the control plane at
// the same moment from coming back at the same moment.
type Backoff struct {
	Base time.Duration // default 500 ms
	Cap  time.Duration // default 30 s
	// Int64N returns a uniform value in [0, n); default math/rand/v2.
	Int64N func(n int64) int64
}

// DefaultBackoff is 500 ms doubling to a 30 s cap, drawing from r (nil:
// the global source).
func DefaultBackoff(r *rand.Rand) Backoff {
	b := Backoff{Base: 500 * time.Millisecond, Cap: 30 * time.Second}
	if r != nil {
		b.Int64N = r.Int64N
	}
	return b
}

// Ceiling is the upper bound of attempt n's delay: min(Cap, Base·2^n).
func (b Backoff) Ceiling(attempt int) time.Duration {
	base, limit := b.Base, b.Cap
	if base <= 0 {
		base = 500 * time.Millisecond
	}
	if limit <= 0 {
		limit = 30 * time.Second
	}
	d := base
	for i := 0; i < attempt && d < limit; i++ {
		d *= 2
	}
	return min(d, limit)
}

// Delay draws attempt n's delay (n counts from 0).
func (b Backoff) Delay(attempt int) time.Duration { return b.DelaySpread(attempt, 0) }

// DelaySpread draws attempt n's delay over [0, max(Ceiling(n), spread)]:
// the window the control plane asked its fleet to spread reconnections
// over (Settings.reconnect_spread_ms), when that is longer than the
// back-off's own step. A large fleet that lost its control plane at once
// then comes back at the rate the control plane can admit, from the first
// attempt on.
func (b Backoff) DelaySpread(attempt int, spread time.Duration) time.Duration {
	n := b.Int64N
	if n == nil {
		n = rand.Int64N
	}
	return time.Duration(n(int64(max(b.Ceiling(attempt), spread)) + 1))
}
