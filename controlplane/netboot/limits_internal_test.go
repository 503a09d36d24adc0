package netboot

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/guard"
)

func TestPanickingHandlerAnswers500AndIsCounted(t *testing.T) {
	s := &Server{Panics: guard.New(prometheus.NewRegistry(), slog.New(slog.DiscardHandler))}
	rec := httptest.NewRecorder()
	s.recovering(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("bug") })).
		ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/ipxe/x", nil))
	if rec.Code != http.StatusInternalServerError {
		t.Fatalf("status %d, want 500", rec.Code)
	}
	if n := testutil.ToFloat64(s.Panics.Count.WithLabelValues("netboot http")); n != 1 {
		t.Fatalf("counted %v panics, want 1", n)
	}
}

// serveLimited runs the netboot server's Serve with small limits on
// loopback; its routes need no store for a 404.
func serveLimited(t *testing.T, idle time.Duration, perSource int) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Clock: clock.Real{}, Log: slog.New(slog.DiscardHandler), IdleTimeout: idle, MaxConnsPerSource: perSource}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return lis.Addr().String()
}

func closedWithin(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	ne, ok := err.(net.Error)
	return !(ok && ne.Timeout())
}

// Issue 26: keep-alive connections were held forever (1,500 at 75 s).
func TestIdleKeepAliveConnectionsAreClosed(t *testing.T) {
	addr := serveLimited(t, 300*time.Millisecond, 0)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if !closedWithin(c, 5*time.Second) {
		t.Fatal("an idle keep-alive connection was still open 5 s after a 300 ms idle timeout")
	}
}

// Past a source's share its oldest connection is closed for the new one.
func TestConnectionsPerSourceAreCapped(t *testing.T) {
	addr := serveLimited(t, time.Minute, 2)
	var conns []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	if !closedWithin(conns[0], 5*time.Second) {
		t.Fatal("the oldest of three connections from one source was kept past a cap of 2")
	}
	for _, c := range conns[1:] {
		if closedWithin(c, 100*time.Millisecond) {
			t.Fatal("a connection within the cap was closed")
		}
	}
}
