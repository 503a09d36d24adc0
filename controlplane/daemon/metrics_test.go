package daemon

import (
	"bytes"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/internal/clock"
)

// addrListener reports another address than it listens on: the warning
// for a non-loopback metrics address is tested without listening beyond
// loopback.
type addrListener struct {
	net.Listener
	addr net.Addr
}

func (a addrListener) Addr() net.Addr { return a.addr }

func TestPprofIsOffUnlessAskedAndWideAddressesWarn(t *testing.T) {
	for _, tc := range []struct {
		name     string
		pprof    bool
		addr     net.Addr
		wantCode int
		warns    bool
	}{
		{"default", false, nil, http.StatusNotFound, false},
		{"--pprof", true, nil, http.StatusOK, false},
		{"wide address", false, &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 9100}, http.StatusNotFound, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inner, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			real := inner.Addr().String()
			var lis net.Listener = inner
			if tc.addr != nil {
				lis = addrListener{inner, tc.addr}
			}
			var logs bytes.Buffer
			srv, bounded := metricsServer(prometheus.NewRegistry(), lis, ServeOptions{Listeners: ListenOptions{Pprof: tc.pprof}, Clock: clock.Real{}},
				slog.New(slog.NewTextHandler(&logs, nil)))
			go func() { _ = srv.Serve(bounded) }()
			t.Cleanup(func() { srv.Close() })
			resp, err := http.Get("http://" + real + "/debug/pprof/")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.wantCode {
				t.Fatalf("/debug/pprof/: %d, want %d", resp.StatusCode, tc.wantCode)
			}
			if got := strings.Contains(logs.String(), "reachable beyond this host"); got != tc.warns {
				t.Fatalf("warned %v, want %v: %s", got, tc.warns, logs.String())
			}
			if srv.IdleTimeout <= 0 {
				t.Fatal("the metrics server holds idle connections forever")
			}
		})
	}
}
