package throttle

import (
	"fmt"
	"testing"
	"time"

	"github.com/tetherfleet/tether/internal/clock"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func TestLimiter(t *testing.T) {
	clk := clock.NewFake(t0)
	l := NewLimiter(clk, 2, 5, 0)
	allowed := func(key string, n int) int {
		ok := 0
		for range n {
			if l.Allow(key) {
				ok++
			}
		}
		return ok
	}
	steps := []struct {
		name    string
		advance time.Duration
		key     string
		tries   int
		want    int
	}{
		{"a burst passes", 0, "a", 5, 5},
		{"then the bucket is empty", 0, "a", 100, 0},
		{"another source has its own bucket", 0, "b", 6, 5},
		{"one second refills two", time.Second, "a", 10, 2},
		{"a long pause refills to the burst, not beyond", time.Hour, "a", 10, 5},
	}
	for _, s := range steps {
		clk.Advance(s.advance)
		if got := allowed(s.key, s.tries); got != s.want {
			t.Fatalf("%s: %d of %d allowed, want %d", s.name, got, s.tries, s.want)
		}
	}
	var nilL *Limiter
	if !nilL.Allow("x") {
		t.Fatal("a nil limiter refused")
	}
}

// A flood from ever new sources keeps the limiter's memory bounded.
func TestLimiterMemoryIsBounded(t *testing.T) {
	clk := clock.NewFake(t0)
	l := NewLimiter(clk, 1, 3, 100)
	for i := range 10000 {
		l.Allow(fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255))
		if i%1000 == 0 {
			clk.Advance(time.Millisecond)
		}
	}
	if n := l.Keys(); n > 100 {
		t.Fatalf("%d keys tracked, bound 100", n)
	}
	// A busy source is not forgotten while the table has idle ones.
	l = NewLimiter(clk, 1, 3, 10)
	for range 3 {
		l.Allow("busy")
	}
	for i := range 9 {
		l.Allow(fmt.Sprint("idle", i))
	}
	clk.Advance(5 * time.Second) // the idle ones refill; busy refills too, so spend it again
	for l.Allow("busy") {
	}
	l.Allow("newcomer")
	if l.Allow("busy") {
		t.Fatal("making room forgot a busy source while idle ones could go")
	}
}

func TestSourceKey(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"192.0.2.7:5123", "192.0.2.7"},
		{"192.0.2.7", "192.0.2.7"},
		{"[2001:db8:1:2:3:4:5:6]:80", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:ffff::1]:81", "2001:db8:1:2::/64"},
		{"[::ffff:192.0.2.7]:80", "192.0.2.7"},
		{"[fe80::1%eth0]:80", "fe80::/64"},
		{"not an address", "not an address"},
	} {
		if got := SourceKey(tc.in); got != tc.want {
			t.Errorf("SourceKey(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestCoalescer(t *testing.T) {
	c := NewCoalescer(time.Minute, 0)
	now := t0
	if w, _ := c.Note("k", now, "first"); !w {
		t.Fatal("the first occurrence was held back")
	}
	for i := range 999 {
		if w, _ := c.Note("k", now.Add(time.Duration(i)*time.Millisecond), nil); w {
			t.Fatalf("occurrence %d inside the window was written", i+2)
		}
	}
	if w, _ := c.Note("other", now, nil); !w {
		t.Fatal("another key's first occurrence was held back")
	}
	if s := c.Flush(now.Add(30*time.Second), false); len(s) != 0 {
		t.Fatalf("a flush inside the window returned %v", s)
	}
	// The next occurrence after the window is written with what was held.
	w, held := c.Note("k", now.Add(61*time.Second), nil)
	if !w || held.Count != 999 || !held.First.Equal(now) || held.Info != "first" {
		t.Fatalf("after the window: write %v, held %+v", w, held)
	}
	// A burst that stops is returned by Flush.
	for range 10 {
		c.Note("k", now.Add(62*time.Second), nil)
	}
	s := c.Flush(now.Add(200*time.Second), false)
	if len(s) != 1 || s[0].Key != "k" || s[0].Count != 10 {
		t.Fatalf("flush: %+v", s)
	}
	if s := c.Flush(now.Add(300*time.Second), false); len(s) != 0 {
		t.Fatalf("a second flush returned %v", s)
	}
	// At shutdown, open windows are flushed too.
	c.Note("k", now.Add(400*time.Second), nil)
	c.Note("k", now.Add(401*time.Second), nil)
	if s := c.Flush(now.Add(402*time.Second), false); len(s) != 0 {
		t.Fatalf("an open window was flushed: %v", s)
	}
	if s := c.Flush(now.Add(402*time.Second), true); len(s) != 1 || s[0].Count != 1 {
		t.Fatalf("flush all: %+v", s)
	}
}

func TestCoalescerMemoryIsBounded(t *testing.T) {
	c := NewCoalescer(time.Minute, 50)
	writes := 0
	for i := range 1000 {
		if w, _ := c.Note(fmt.Sprint("k", i), t0, nil); w {
			writes++
		}
	}
	if len(c.open) > 50 {
		t.Fatalf("%d keys tracked, bound 50", len(c.open))
	}
	// Nothing is lost: keys beyond the bound are written, not dropped.
	if writes != 1000 {
		t.Fatalf("%d of 1000 first occurrences written", writes)
	}
}
