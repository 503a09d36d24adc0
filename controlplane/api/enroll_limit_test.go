package api

import (
	"context"
	"net"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/throttle"
	"github.com/tetherfleet/tether/internal/clock"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// Enrollments over a source's rate are refused with ResourceExhausted
// before any work (no enrollment service runs here) and counted.
func TestEnrollRateLimitIsCountedPerRoute(t *testing.T) {
	m := NewMetrics(nil)
	e := &enrollmentServer{Config: Config{EnrollLimiter: throttle.NewLimiter(clock.NewFake(t0), 0, 0, 0)}, m: m}
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP("192.0.2.9"), Port: 4000}})
	for range 3 {
		_, err := e.Enroll(ctx, &v1.EnrollRequest{Token: "tbt_x", CsrPem: "x"})
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("got %v, want ResourceExhausted", err)
		}
	}
	var got dto.Metric
	if err := m.RateLimited.WithLabelValues("enroll").Write(&got); err != nil {
		t.Fatal(err)
	}
	if n := got.GetCounter().GetValue(); n != 3 {
		t.Fatalf("tether_rate_limited_total{route=enroll} = %v, want 3", n)
	}
}
