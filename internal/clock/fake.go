package clock

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"
)

// Fake is a clock tests set and advance. Timers, tickers and AfterFunc
// callbacks fire only when Advance or Set moves the time past their
// deadline, in deadline order (ties in creation order). Their channels hold
// one value, like the standard library's: a tick nobody reads is dropped.
type Fake struct {
	mu      sync.Mutex
	t       time.Time
	seq     uint64
	waiters []*fakeWaiter
	// changed is closed and replaced whenever the set of waiters changes,
	// so BlockUntil can wait without polling.
	changed chan struct{}
}

type fakeWaiter struct {
	f        *Fake
	seq      uint64
	when     time.Time
	d        time.Duration // what it was armed for (see Pending)
	period   time.Duration // tickers only
	c        chan time.Time
	fn       func() // AfterFunc only
	armed    bool
	isTicker bool
}

// NewFake starts a fake clock at t.
func NewFake(t time.Time) *Fake { return &Fake{t: t, changed: make(chan struct{})} }

// Now implements Clock.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.t
}

// After implements Clock.
func (f *Fake) After(d time.Duration) <-chan time.Time { return f.NewTimer(d).C() }

// NewTimer implements Clock. A timer of d <= 0 fires at once.
func (f *Fake) NewTimer(d time.Duration) Timer {
	w := &fakeWaiter{f: f, c: make(chan time.Time, 1)}
	f.arm(w, d, 0)
	return (*fakeTimer)(w)
}

// AfterFunc implements Clock.
func (f *Fake) AfterFunc(d time.Duration, fn func()) Timer {
	w := &fakeWaiter{f: f, fn: fn}
	f.arm(w, d, 0)
	return (*fakeTimer)(w)
}

// NewTicker implements Clock. Like time.NewTicker it panics on d <= 0.
func (f *Fake) NewTicker(d time.Duration) Ticker {
	if d <= 0 {
		panic("clock: non-positive interval for NewTicker")
	}
	w := &fakeWaiter{f: f, c: make(chan time.Time, 1), isTicker: true}
	f.arm(w, d, d)
	return (*fakeTicker)(w)
}

// arm schedules w at now+d; a due timer fires before arm returns.
func (f *Fake) arm(w *fakeWaiter, d, period time.Duration) bool {
	f.mu.Lock()
	was := f.remove(w)
	w.period = period
	f.seq++
	w.seq, w.when, w.d, w.armed = f.seq, f.t.Add(d), d, true
	f.waiters = append(f.waiters, w)
	f.notify()
	f.mu.Unlock()
	if d <= 0 {
		f.fire(f.Now())
	}
	return was
}

// remove unschedules w and reports whether it was scheduled. f.mu is held.
func (f *Fake) remove(w *fakeWaiter) bool {
	if !w.armed {
		return false
	}
	w.armed = false
	for i, x := range f.waiters {
		if x == w {
			f.waiters = append(f.waiters[:i], f.waiters[i+1:]...)
			break
		}
	}
	f.notify()
	return true
}

func (f *Fake) notify() {
	if f.changed != nil {
		close(f.changed)
	}
	f.changed = make(chan struct{})
}

func (f *Fake) stop(w *fakeWaiter) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.remove(w)
}

// Advance moves the clock forward by d, firing everything that falls due
// on the way, in order, each at its own deadline.
func (f *Fake) Advance(d time.Duration) {
	f.Set(f.Now().Add(d))
}

// Set moves the clock to t, firing what falls due by then. Moving it
// backwards fires nothing.
func (f *Fake) Set(t time.Time) {
	f.fire(t)
	f.mu.Lock()
	f.t = t
	f.mu.Unlock()
}

// fire delivers, one at a time and in deadline order, every waiter due by
// `until`. The clock reads each waiter's deadline while it fires, so a
// callback that looks at Now sees its own moment.
func (f *Fake) fire(until time.Time) {
	for {
		f.mu.Lock()
		sort.SliceStable(f.waiters, func(i, j int) bool {
			a, b := f.waiters[i], f.waiters[j]
			if !a.when.Equal(b.when) {
				return a.when.Before(b.when)
			}
			return a.seq < b.seq
		})
		if len(f.waiters) == 0 || f.waiters[0].when.After(until) {
			f.mu.Unlock()
			return
		}
		w := f.waiters[0]
		if w.when.After(f.t) {
			f.t = w.when
		}
		at := f.t
		if w.isTicker {
			// Re-arm from the deadline, not from now, so ticks keep their
			// phase however far one Advance jumps.
			f.seq++
			w.seq, w.when = f.seq, w.when.Add(w.period)
			f.notify()
		} else {
			f.remove(w)
		}
		f.mu.Unlock()
		switch {
		case w.fn != nil:
			go w.fn()
		default:
			select {
			case w.c <- at:
			default: // nobody read the last one; drop it like time.Ticker
			}
		}
	}
}

// Waiters returns how many timers, tickers and AfterFunc callbacks are
// armed.
func (f *Fake) Waiters() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.waiters)
}

// BlockUntil returns once at least n timers, tickers or callbacks are armed,
// so a test knows the code under test is waiting before it advances the
// clock. It fails with ctx's error when ctx ends first.
func (f *Fake) BlockUntil(ctx context.Context, n int) error {
	err := f.BlockUntilPending(ctx, func(p []time.Duration) bool { return len(p) >= n })
	if err != nil {
		return fmt.Errorf("clock: fewer than %d waiters armed: %w", n, err)
	}
	return nil
}

// Pending returns what each armed timer, ticker and callback was armed
// for (the d of NewTimer, After, AfterFunc or Reset; a ticker's period),
// in deadline order, so a test can check how long the code under test
// chose to wait, not only that it waits.
func (f *Fake) Pending() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pendingLocked()
}

func (f *Fake) pendingLocked() []time.Duration {
	ws := slices.Clone(f.waiters)
	sort.SliceStable(ws, func(i, j int) bool {
		if !ws[i].when.Equal(ws[j].when) {
			return ws[i].when.Before(ws[j].when)
		}
		return ws[i].seq < ws[j].seq
	})
	out := make([]time.Duration, len(ws))
	for i, w := range ws {
		out[i] = w.d
		if w.isTicker {
			out[i] = w.period
		}
	}
	return out
}

// BlockUntilPending returns once ok holds for Pending(); ok is called
// again whenever the armed set changes. It fails with ctx's error, naming
// what was pending, when ctx ends first.
func (f *Fake) BlockUntilPending(ctx context.Context, ok func(pending []time.Duration) bool) error {
	for {
		f.mu.Lock()
		if f.changed == nil {
			f.changed = make(chan struct{})
		}
		pending, changed := f.pendingLocked(), f.changed
		f.mu.Unlock()
		if ok(pending) {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("clock: pending waits %v: %w", pending, ctx.Err())
		}
	}
}

// AutoAdvance fires each timer and AfterFunc callback as soon as it is
// armed, moving the clock to its deadline, until ctx ends: for tests of
// code whose waits do not matter to them (retry back-offs), which then
// run without real waiting. Tickers are left alone (they are always
// armed; firing them on arrival would spin): advance those by hand.
func (f *Fake) AutoAdvance(ctx context.Context) {
	for {
		f.mu.Lock()
		if f.changed == nil {
			f.changed = make(chan struct{})
		}
		var next *fakeWaiter
		for _, w := range f.waiters {
			if !w.isTicker && (next == nil || w.when.Before(next.when)) {
				next = w
			}
		}
		changed := f.changed
		f.mu.Unlock()
		if next != nil {
			// Set fires what falls due, tickers included, in order.
			if f.Now().Before(next.when) {
				f.Set(next.when)
			} else {
				f.fire(f.Now())
			}
			continue
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		}
	}
}

type fakeTimer fakeWaiter

func (t *fakeTimer) C() <-chan time.Time { return t.c }
func (t *fakeTimer) Stop() bool          { return t.f.stop((*fakeWaiter)(t)) }
func (t *fakeTimer) Reset(d time.Duration) bool {
	return t.f.arm((*fakeWaiter)(t), d, 0)
}

type fakeTicker fakeWaiter

func (t *fakeTicker) C() <-chan time.Time { return t.c }
func (t *fakeTicker) Stop()               { t.f.stop((*fakeWaiter)(t)) }
func (t *fakeTicker) Reset(d time.Duration) {
	if d <= 0 {
		panic("clock: non-positive interval for Ticker.Reset")
	}
	t.f.arm((*fakeWaiter)(t), d, d)
}
