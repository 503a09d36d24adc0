// Package throttle bounds what unauthenticated callers can make the
// control plane do: a per-source token bucket for request rates, and a
// coalescer that turns a burst of identical refusals into one event with
// a count. Both keep bounded memory whatever the callers send, and both
// read time from an injected clock.
package throttle

import (
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/tetherfleet/tether/internal/clock"
)

// Limiter is a token bucket per key (a source address): each key may
// make Burst requests at once and PerSecond on average.
type Limiter struct {
	clock     clock.Clock
	perSecond float64
	burst     float64
	maxKeys   int

	mu        sync.Mutex
	buckets   map[string]*bucket
	lastSweep time.Time
}

type bucket struct {
	tokens float64
	at     time.Time
}

// DefaultMaxKeys bounds the sources a Limiter tracks at once.
const DefaultMaxKeys = 16384

// NewLimiter returns a limiter allowing burst requests at once and
// perSecond on average per key, tracking at most maxKeys keys (zero:
// DefaultMaxKeys). A nil *Limiter allows everything.
func NewLimiter(c clock.Clock, perSecond float64, burst, maxKeys int) *Limiter {
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	return &Limiter{clock: c, perSecond: perSecond, burst: float64(burst), maxKeys: maxKeys, buckets: map[string]*bucket{}}
}

// Allow takes one token from key's bucket and reports whether there was
// one.
func (l *Limiter) Allow(key string) bool {
	if l == nil {
		return true
	}
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.buckets[key]
	if !ok {
		if len(l.buckets) >= l.maxKeys {
			l.makeRoom(now)
		}
		b = &bucket{tokens: l.burst, at: now}
		l.buckets[key] = b
	}
	if dt := now.Sub(b.at).Seconds(); dt > 0 {
		b.tokens = min(l.burst, b.tokens+dt*l.perSecond)
	}
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// makeRoom forgets the buckets that have refilled (forgetting one changes
// nothing: a new bucket starts full) and, if every key is still busy,
// one arbitrary key: memory stays bounded, and a caller that cycles
// through more sources than maxKeys to reset its own bucket already
// commands that many addresses.
func (l *Limiter) makeRoom(now time.Time) {
	// A full sweep at most once a second keeps a flood of new sources
	// from costing a sweep per request.
	if now.Sub(l.lastSweep) >= time.Second {
		l.lastSweep = now
		for k, b := range l.buckets {
			if b.tokens+now.Sub(b.at).Seconds()*l.perSecond >= l.burst {
				delete(l.buckets, k)
			}
		}
	}
	for k := range l.buckets {
		if len(l.buckets) < l.maxKeys {
			return
		}
		delete(l.buckets, k)
	}
}

// Keys is how many keys the limiter tracks now.
func (l *Limiter) Keys() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}

// SourceKey is the rate-limit key of a remote address ("ip:port" or a
// bare IP): the IP for IPv4, the /64 for IPv6, which one host usually
// holds whole.
func SourceKey(remote string) string {
	host := remote
	if h, _, err := net.SplitHostPort(remote); err == nil {
		host = h
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return remote
	}
	a = a.Unmap().WithZone("")
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.String()
	}
	return a.String()
}

// Coalescer counts repeated occurrences of the same thing (a refusal for
// one token, or one instance and source) so that a window writes one
// record for the first and one summary for the rest, however many come.
type Coalescer struct {
	window  time.Duration
	maxKeys int

	mu   sync.Mutex
	open map[string]*span
}

type span struct {
	start, last time.Time
	suppressed  int
	info        any
}

// Summary is what a window held back: Count occurrences of Key between
// First and Last, after the one that was written at the window's start.
// Info is what the caller passed with that first occurrence.
type Summary struct {
	Key         string
	Count       int
	First, Last time.Time
	Info        any
}

// NewCoalescer returns a coalescer with the given window, tracking at
// most maxKeys keys (zero: DefaultMaxKeys).
func NewCoalescer(window time.Duration, maxKeys int) *Coalescer {
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	return &Coalescer{window: window, maxKeys: maxKeys, open: map[string]*span{}}
}

// Note records one occurrence of key at now, with info to hand back in
// its window's summary. write says whether to write
// a record for it; if so, held is a summary of the previous window's
// held-back occurrences to write with it (Count zero when there were
// none). When write is false the occurrence is counted for a later
// summary.
func (c *Coalescer) Note(key string, now time.Time, info any) (write bool, held Summary) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.open[key]
	if ok && now.Sub(s.start) < c.window {
		s.suppressed++
		s.last = now
		return false, Summary{}
	}
	if ok && s.suppressed > 0 {
		held = s.summary(key)
	}
	if !ok && len(c.open) >= c.maxKeys {
		c.expire(now)
		if len(c.open) >= c.maxKeys {
			// Every tracked key is in a live window: write this one
			// uncoalesced rather than forget a count. The rate limits in
			// front bound how often that can happen.
			return true, Summary{}
		}
	}
	c.open[key] = &span{start: now, last: now, info: info}
	return true, held
}

// expire drops windows that ended with nothing held back.
func (c *Coalescer) expire(now time.Time) {
	for k, s := range c.open {
		if now.Sub(s.start) >= c.window && s.suppressed == 0 {
			delete(c.open, k)
		}
	}
}

func (s *span) summary(key string) Summary {
	return Summary{Key: key, Count: s.suppressed, First: s.start, Last: s.last, Info: s.info}
}

// Flush returns the summaries of every window that has ended and forgets
// those windows. Call it every window or so, so that a burst that stops
// is still written down. all flushes open windows too (at shutdown).
func (c *Coalescer) Flush(now time.Time, all bool) []Summary {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Summary
	for k, s := range c.open {
		if !all && now.Sub(s.start) < c.window {
			continue
		}
		if s.suppressed > 0 {
			out = append(out, s.summary(k))
		}
		delete(c.open, k)
	}
	return out
}

// Window is the coalescing window.
func (c *Coalescer) Window() time.Duration { return c.window }
