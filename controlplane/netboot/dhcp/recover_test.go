package dhcp

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/iana"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tetherfleet/tether/internal/guard"
)

// panicLeases is a lease table with a bug.
type panicLeases struct{ calls chan struct{} }

func (p panicLeases) Lease(context.Context, string, time.Time, time.Duration) (netip.Addr, error) {
	p.calls <- struct{}{}
	panic("lease table bug")
}
func (p panicLeases) Current(context.Context, string, time.Time) (netip.Addr, bool, error) {
	return netip.Addr{}, false, nil
}
func (p panicLeases) Release(context.Context, string) error { return nil }

// A panic while handling one packet is recovered and counted, and the
// server goes on reading packets: the handler's goroutines are the
// server's, and an unrecovered panic in one ends the process.
func TestPanicInOnePacketLeavesTheServerServing(t *testing.T) {
	h := newHandler(t, Full)
	calls := make(chan struct{}, 2)
	h.Leases = panicLeases{calls}
	panics := guard.New(prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	srv := &Server{Handler: h, Log: slog.New(slog.DiscardHandler), Panics: panics}
	conn, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.ServeConn(ctx, conn) }()
	client, err := net.Dial("udp4", conn.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	for i := range 2 {
		if _, err := client.Write(discover(t, pxe(iana.INTEL_X86PC, "PXEClient")...)); err != nil {
			t.Fatal(err)
		}
		select {
		case <-calls:
		case <-time.After(10 * time.Second):
			t.Fatalf("packet %d was not handled: the server stopped reading", i)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("ServeConn: %v", err)
	}
	// ServeConn waits for its handlers, so both recoveries are counted.
	if n := testutil.ToFloat64(panics.Count.WithLabelValues("dhcp")); n != 2 {
		t.Fatalf("counted %v panics, want 2", n)
	}
}
