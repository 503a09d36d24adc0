package connlimit

import (
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/testkit/logbuf"
)

// dialFrom opens a TCP connection to addr from a loopback source address.
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial from %s: %v", src, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByServer reports whether the server closed c (a read sees EOF or
// a reset) before the deadline.
func closedByServer(c net.Conn, within time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(within))
	_, err := c.Read(make([]byte, 1))
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return false
	}
	return err != nil
}

// value reads a counter or gauge.
func value(m prometheus.Metric) float64 {
	var out dto.Metric
	if err := m.Write(&out); err != nil {
		panic(err)
	}
	if out.Counter != nil {
		return out.Counter.GetValue()
	}
	return out.Gauge.GetValue()
}

type fixture struct {
	l       *Listener
	refused *prometheus.CounterVec
	open    prometheus.Gauge
	clk     *clock.Fake
	log     *lockedBuffer
	// accepted receives what Accept returns.
	accepted chan *Conn
}

func start(t *testing.T, o Options) *fixture {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{
		refused:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "refused"}, []string{"reason"}),
		open:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "open"}),
		clk:      clock.NewFake(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)),
		log:      &lockedBuffer{},
		accepted: make(chan *Conn, 64),
	}
	o.Refused, o.Open, o.Clock = f.refused, f.open, f.clk
	o.Log = slog.New(slog.NewTextHandler(f.log, nil))
	f.l = Wrap(inner, o)
	go func() {
		for {
			c, err := f.l.Accept()
			if err != nil {
				close(f.accepted)
				return
			}
			f.accepted <- c.(*Conn)
		}
	}()
	t.Cleanup(func() { f.l.Close() })
	return f
}

func (f *fixture) next(t *testing.T) *Conn {
	t.Helper()
	select {
	case c := <-f.accepted:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no connection accepted")
		return nil
	}
}

func TestCaps(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		// srcs are the source addresses dialled in order; admitted says
		// which of them the listener must hand on.
		srcs     []string
		admitted []bool
		reason   string
	}{
		{"total cap", Options{MaxConns: 2}, []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"}, []bool{true, true, false}, ReasonMaxConnections},
		{"per source cap", Options{MaxPendingPerSource: 2}, []string{"127.0.0.2", "127.0.0.2", "127.0.0.2", "127.0.0.3"},
			[]bool{true, true, false, true}, ReasonPendingSource},
		{"no caps", Options{}, []string{"127.0.0.2", "127.0.0.2", "127.0.0.2"}, []bool{true, true, true}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := start(t, tc.opts)
			wantRefused := 0
			for i, src := range tc.srcs {
				c := dialFrom(t, src, f.l.Addr().String())
				if tc.admitted[i] {
					f.next(t)
					continue
				}
				wantRefused++
				if !closedByServer(c, 10*time.Second) {
					t.Fatalf("connection %d from %s held, want it closed at accept time", i, src)
				}
			}
			if tc.reason != "" {
				if got := value(f.refused.WithLabelValues(tc.reason)); int(got) != wantRefused {
					t.Fatalf("refused{%s} = %v, want %d", tc.reason, got, wantRefused)
				}
			}
			admitted := 0
			for _, a := range tc.admitted {
				if a {
					admitted++
				}
			}
			if got := value(f.open); int(got) != admitted {
				t.Fatalf("open gauge %v, want %d", got, admitted)
			}
		})
	}
}

// A place is given back when a connection closes, and a handshaken
// connection no longer counts against its source's pending cap.
func TestPlacesComeBack(t *testing.T) {
	f := start(t, Options{MaxConns: 3, MaxPendingPerSource: 1})
	addr := f.l.Addr().String()
	dialFrom(t, "127.0.0.2", addr)
	first := f.next(t)
	if !closedByServer(dialFrom(t, "127.0.0.2", addr), 10*time.Second) {
		t.Fatal("a second pending connection from one source was held")
	}
	first.Authenticated()
	first.Authenticated() // twice is once
	dialFrom(t, "127.0.0.2", addr)
	second := f.next(t)
	if got := f.l.Stats(); got.Open != 2 || got.Pending["127.0.0.2"] != 1 {
		t.Fatalf("stats %+v, want 2 open and 1 pending", got)
	}
	second.Close()
	second.Close() // twice is once
	first.Close()
	if got := f.l.Stats(); got.Open != 0 || len(got.Pending) != 0 {
		t.Fatalf("stats after closing %+v, want nothing held", got)
	}
	for i := 0; i < 3; i++ {
		dialFrom(t, "127.0.0.1"+string(rune('0'+i)), addr)
		f.next(t)
	}
	if !closedByServer(dialFrom(t, "127.0.0.20", addr), 10*time.Second) {
		t.Fatal("a fourth connection past MaxConns 3 was held")
	}
}

// Refusals are logged at most once per interval, with the count since
// the last line.
func TestRefusalLogIsRateLimited(t *testing.T) {
	f := start(t, Options{MaxConns: 1, LogEvery: 10 * time.Second})
	addr := f.l.Addr().String()
	dialFrom(t, "127.0.0.2", addr)
	f.next(t)
	refuseOne := func() {
		if !closedByServer(dialFrom(t, "127.0.0.3", addr), 10*time.Second) {
			t.Fatal("connection past the cap was held")
		}
	}
	for i := 0; i < 5; i++ {
		refuseOne()
	}
	if n := strings.Count(f.log.String(), "refusing connections"); n != 1 {
		t.Fatalf("%d log lines for 5 refusals within the interval, want 1:\n%s", n, f.log)
	}
	f.clk.Advance(11 * time.Second)
	refuseOne()
	out := f.log.String()
	if n := strings.Count(out, "refusing connections"); n != 2 {
		t.Fatalf("%d log lines after the interval, want 2:\n%s", n, out)
	}
	if !strings.Contains(out, "max_connections:5") {
		t.Fatalf("second line does not count the 5 refusals since the first (4 unlogged and its own):\n%s", out)
	}
}

var _ io.Closer = (*Conn)(nil)

// lockedBuffer is a log the listener's goroutine writes while the test reads.
type lockedBuffer = logbuf.Buffer
