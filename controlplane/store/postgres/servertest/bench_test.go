package servertest

import (
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tetherfleet/tether/internal/testkit/testcp"
	"github.com/tetherfleet/tether/internal/tools/bench"
)

const benchClients = 64

// BenchmarkEnroll: 64 clients on kept-alive TLS connections enroll b.N
// instances whose tokens and CSRs were made before the clock starts, once
// on SQLite and once on PostgreSQL (fsync on for both). Run it with a
// fixed count, so each store does the same work once:
//
//	go test -tags nobadger,nobbolt,nomysql -run '^$' -bench Enroll -benchtime 2000x ./controlplane/store/postgres/servertest/
func BenchmarkEnroll(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts func(b *testing.B) []testcp.Option
	}{
		{"sqlite", func(*testing.B) []testcp.Option { return nil }},
		{"postgres", func(b *testing.B) []testcp.Option { return []testcp.Option{testcp.WithStore(pgDurable.DSN(b))} }},
	} {
		b.Run(bc.name, func(b *testing.B) { benchEnroll(b, testcp.Start(b, bc.opts(b)...)) })
	}
}

func benchEnroll(b *testing.B, cp *testcp.ControlPlane) {
	ctx := ctxT(b, 10*time.Minute)
	fleet := cp.SeedFleet(ctx, "bench")
	es, err := bench.PrepareEnrollments(ctx, cp.Admin, fleet.Node, b.N)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	r, err := bench.EnrollLoad(ctx, func() (*grpc.ClientConn, error) { return cp.Dial(nil), nil }, es, benchClients, false)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	if r.Errors > 0 {
		b.Fatalf("%d of %d enrollments failed; first: %v", r.Errors, r.N, r.FirstError)
	}
	b.ReportMetric(r.Rate(), "enrollments/s")
	b.ReportMetric(ms(r.P50), "p50_ms")
	b.ReportMetric(ms(r.P99), "p99_ms")
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
