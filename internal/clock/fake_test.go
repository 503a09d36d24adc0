package clock_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherfleet/tether/internal/clock"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Both clocks satisfy the interface the whole tree injects.
var _ = []clock.Clock{clock.Real{}, clock.NewFake(t0)}

func recv(t *testing.T, c <-chan time.Time) (time.Time, bool) {
	t.Helper()
	select {
	case v := <-c:
		return v, true
	default:
		return time.Time{}, false
	}
}

func TestFakeTimer(t *testing.T) {
	tests := []struct {
		name     string
		timer    time.Duration
		advances []time.Duration
		fired    []bool // after each advance
	}{
		{"fires at its deadline", 10 * time.Second, []time.Duration{9 * time.Second, time.Second}, []bool{false, true}},
		{"fires once however far", time.Second, []time.Duration{time.Hour, time.Hour}, []bool{true, false}},
		{"zero fires at once", 0, []time.Duration{0}, []bool{true}},
		{"negative fires at once", -time.Second, []time.Duration{0}, []bool{true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := clock.NewFake(t0)
			tm := f.NewTimer(tc.timer)
			for i, d := range tc.advances {
				f.Advance(d)
				v, ok := recv(t, tm.C())
				if ok != tc.fired[i] {
					t.Fatalf("advance %d: fired=%v, want %v", i, ok, tc.fired[i])
				}
				if ok && tc.timer > 0 && !v.Equal(t0.Add(tc.timer)) {
					t.Fatalf("fired with %v, want its deadline %v", v, t0.Add(tc.timer))
				}
			}
		})
	}
}

func TestFakeTimerStopAndReset(t *testing.T) {
	f := clock.NewFake(t0)
	tm := f.NewTimer(time.Second)
	if !tm.Stop() {
		t.Fatal("Stop of a pending timer reported false")
	}
	if tm.Stop() {
		t.Fatal("second Stop reported true")
	}
	f.Advance(time.Minute)
	if _, ok := recv(t, tm.C()); ok {
		t.Fatal("a stopped timer fired")
	}
	if tm.Reset(time.Second) {
		t.Fatal("Reset of a stopped timer reported it pending")
	}
	if !tm.Reset(2 * time.Second) {
		t.Fatal("Reset of a pending timer reported it stopped")
	}
	f.Advance(time.Second)
	if _, ok := recv(t, tm.C()); ok {
		t.Fatal("Reset did not move the deadline")
	}
	f.Advance(time.Second)
	if _, ok := recv(t, tm.C()); !ok {
		t.Fatal("reset timer did not fire")
	}
}

func TestFakeTicker(t *testing.T) {
	f := clock.NewFake(t0)
	tk := f.NewTicker(10 * time.Second)
	for i := 1; i <= 3; i++ {
		f.Advance(10 * time.Second)
		v, ok := recv(t, tk.C())
		if !ok || !v.Equal(t0.Add(time.Duration(i)*10*time.Second)) {
			t.Fatalf("tick %d: %v %v", i, v, ok)
		}
	}
	// A jump over several periods delivers one tick (the channel holds one)
	// and keeps the phase.
	f.Advance(35 * time.Second)
	if _, ok := recv(t, tk.C()); !ok {
		t.Fatal("no tick after a long jump")
	}
	if _, ok := recv(t, tk.C()); ok {
		t.Fatal("more than one buffered tick")
	}
	f.Advance(5 * time.Second)
	if v, ok := recv(t, tk.C()); !ok || !v.Equal(t0.Add(70*time.Second)) {
		t.Fatalf("phase lost: %v %v", v, ok)
	}
	tk.Reset(time.Second)
	f.Advance(time.Second)
	if _, ok := recv(t, tk.C()); !ok {
		t.Fatal("no tick after Reset")
	}
	tk.Stop()
	f.Advance(time.Hour)
	if _, ok := recv(t, tk.C()); ok {
		t.Fatal("a stopped ticker ticked")
	}
	if f.Waiters() != 0 {
		t.Fatalf("%d waiters after stop", f.Waiters())
	}
}

func TestFakeFiresInDeadlineOrder(t *testing.T) {
	f := clock.NewFake(t0)
	ran := make(chan string, 3)
	for _, c := range []struct {
		name string
		d    time.Duration
	}{{"c", 3 * time.Second}, {"a", time.Second}, {"b", 2 * time.Second}} {
		f.AfterFunc(c.d, func() { ran <- c.name })
	}
	// Advance to each deadline in turn; exactly the due callback runs.
	var order string
	for i := 0; i < 3; i++ {
		f.Advance(time.Second)
		select {
		case name := <-ran:
			order += name
		case <-time.After(10 * time.Second):
			t.Fatalf("callback %d did not run", i)
		}
	}
	if order != "abc" {
		t.Fatalf("fired %s, want abc", order)
	}

	// Within one Advance, channels fill in deadline order: the later
	// timer's Now() check sees its own deadline.
	t1, t2 := f.NewTimer(2*time.Second), f.NewTimer(time.Second)
	f.Advance(time.Hour)
	v1, _ := recv(t, t1.C())
	v2, _ := recv(t, t2.C())
	if !v2.Before(v1) {
		t.Fatalf("timers fired at %v and %v, want deadline order", v2, v1)
	}
	if !f.Now().Equal(t0.Add(3*time.Second + time.Hour)) {
		t.Fatalf("clock at %v after the advance", f.Now())
	}
}

func TestFakeAfterFuncStop(t *testing.T) {
	f := clock.NewFake(t0)
	ran := make(chan struct{}, 1)
	tm := f.AfterFunc(time.Second, func() { ran <- struct{}{} })
	if tm.C() != nil {
		t.Fatal("AfterFunc timer has a channel")
	}
	if !tm.Stop() {
		t.Fatal("Stop reported the callback already run")
	}
	f.Advance(time.Minute)
	select {
	case <-ran:
		t.Fatal("a stopped callback ran")
	default:
	}
}

// BlockUntil lets a test advance only once the code under test waits: the
// goroutine below arms a timer some time after the test starts.
func TestFakeBlockUntil(t *testing.T) {
	f := clock.NewFake(t0)
	start := make(chan struct{})
	got := make(chan time.Time)
	go func() {
		<-start
		got <- <-f.After(time.Minute)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := f.BlockUntil(ctx, 1); err == nil {
		t.Fatal("BlockUntil returned with no waiter armed")
	}
	close(start)
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.BlockUntil(ctx, 1); err != nil {
		t.Fatal(err)
	}
	f.Advance(time.Minute)
	if v := <-got; !v.Equal(t0.Add(time.Minute)) {
		t.Fatalf("woke at %v", v)
	}
}

func TestFakeConcurrentUse(t *testing.T) {
	f := clock.NewFake(t0)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 100; j++ {
				tm := f.NewTimer(time.Duration(j) * time.Millisecond)
				tk := f.NewTicker(time.Millisecond)
				f.Advance(time.Millisecond)
				tm.Reset(time.Second)
				tm.Stop()
				tk.Stop()
				_ = f.Now()
			}
		}()
	}
	wg.Wait()
	if f.Waiters() != 0 {
		t.Fatalf("%d waiters left", f.Waiters())
	}
}

// Pending names what each armed waiter was armed for, in deadline order,
// and BlockUntilPending waits for a particular one: tests that assert how
// long the code waited use these instead of a hand-written clock.
func TestFakePending(t *testing.T) {
	f := clock.NewFake(t0)
	tm := f.NewTimer(3 * time.Second)
	tk := f.NewTicker(time.Second)
	f.AfterFunc(2*time.Second, func() {})
	_ = f.After(0) // fired at once: not pending
	tests := []struct {
		name string
		do   func()
		want []time.Duration
	}{
		{"armed", func() {}, []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}},
		// The callback has run; the ticker re-armed for its period and is
		// now due with the timer, which was armed first.
		{"after 2s", func() { f.Advance(2 * time.Second) }, []time.Duration{3 * time.Second, time.Second}},
		// Reset records the new duration.
		{"reset", func() { tm.Reset(10 * time.Second) }, []time.Duration{time.Second, 10 * time.Second}},
		{"stopped", func() { tk.Stop(); tm.Stop() }, []time.Duration{}},
	}
	for _, tc := range tests {
		tc.do()
		if got := f.Pending(); !slices.Equal(got, tc.want) {
			t.Fatalf("%s: Pending = %v, want %v", tc.name, got, tc.want)
		}
	}

	go func() {
		_ = f.After(time.Minute)
		_ = f.After(5 * time.Second)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.BlockUntilPending(ctx, func(p []time.Duration) bool { return slices.Contains(p, 5*time.Second) }); err != nil {
		t.Fatal(err)
	}
	short, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	err := f.BlockUntilPending(short, func(p []time.Duration) bool { return slices.Contains(p, time.Hour) })
	if err == nil || !strings.Contains(err.Error(), "[5s 1m0s]") {
		t.Fatalf("BlockUntilPending for a wait nobody makes = %v, want the pending waits named", err)
	}
}

// AutoAdvance lets a retry loop run through its back-offs at once, with
// the clock showing the time they add up to.
func TestFakeAutoAdvance(t *testing.T) {
	f := clock.NewFake(t0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go f.AutoAdvance(ctx)
	tk := f.NewTicker(time.Hour) // left alone
	defer tk.Stop()
	var total time.Duration
	for _, d := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 0} {
		<-f.After(d)
		total += d
	}
	done := make(chan struct{})
	f.AfterFunc(time.Minute, func() { close(done) })
	<-done
	total += time.Minute
	if got := f.Now().Sub(t0); got != total {
		t.Fatalf("clock moved %v, want %v", got, total)
	}
	select {
	case <-tk.C():
		t.Fatal("AutoAdvance fired a ticker")
	default:
	}
}
