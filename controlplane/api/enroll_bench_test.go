package api_test

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc"

	"github.com/tetherfleet/tether/internal/testkit/testcp"
	"github.com/tetherfleet/tether/internal/tools/bench"
)

// BenchmarkEnroll measures enrollment over real TLS on loopback: tokens and
// CSRs are made before the timed phase; each enrollment checks and spends
// its token, signs, and records the certificate durably (SQLite, FULL sync).
// Run with a fixed count, e.g. -benchtime 2000x.
func BenchmarkEnroll(b *testing.B) {
	for _, tc := range []struct {
		c         int
		handshake bool
	}{{1, false}, {16, false}, {64, false}, {64, true}} {
		name := fmt.Sprintf("clients=%d", tc.c)
		if tc.handshake {
			name += "/handshake-per-enrollment"
		}
		b.Run(name, func(b *testing.B) {
			cp := testcp.Start(b)
			ctx := context.Background()
			fleet := cp.SeedFleet(ctx, "bench")
			es, err := bench.PrepareEnrollments(ctx, cp.Admin, fleet.Node, b.N)
			if err != nil {
				b.Fatal(err)
			}
			dial := func() (*grpc.ClientConn, error) { return cp.Dial(nil), nil }
			b.ResetTimer()
			r, err := bench.EnrollLoad(ctx, dial, es, tc.c, tc.handshake)
			b.StopTimer()
			if err != nil {
				b.Fatal(err)
			}
			if r.Errors > 0 {
				b.Fatalf("%d of %d enrollments failed; first: %v", r.Errors, r.N, r.FirstError)
			}
			b.ReportMetric(r.Rate(), "enroll/s")
			b.ReportMetric(float64(r.P50.Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(r.P99.Microseconds())/1000, "p99-ms")
		})
	}
}
