package guard_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tetherfleet/tether/internal/guard"
)

func TestRecoverLogsCountsAndReturns(t *testing.T) {
	var buf bytes.Buffer
	p := guard.New(prometheus.NewRegistry(), slog.New(slog.NewTextHandler(&buf, nil)))
	func() {
		defer p.Recover("tftp")
		var b []byte
		_ = b[3] // index out of range, as the TFTP library's parser did
	}()
	if got := testutil.ToFloat64(p.Count.WithLabelValues("tftp")); got != 1 {
		t.Fatalf("counted %v panics, want 1", got)
	}
	if !strings.Contains(buf.String(), "index out of range") || !strings.Contains(buf.String(), "listener=tftp") {
		t.Fatalf("log line: %s", buf.String())
	}
}

func TestNilPanicsStillRecovers(t *testing.T) {
	var p *guard.Panics
	func() {
		defer p.Recover("dhcp")
		panic("boom")
	}()
	if err := p.Note("dhcp", "boom"); err == nil || !strings.Contains(err.Error(), "dhcp") {
		t.Fatalf("Note: %v", err)
	}
}
