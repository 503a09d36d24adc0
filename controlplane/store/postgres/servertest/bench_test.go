package servertest

import (
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/connectivity"

	"github.com/tetherfleet/tether/internal/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
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
	tokens := make([]string, b.N)
	csrs := make([]string, b.N)
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < b.N; i = int(next.Add(1) - 1) {
				_, tokens[i] = cp.Provision(ctx, fleet.Node)
				csrs[i] = testcp.NewNodeKey(b).CSRPEM
			}
		}()
	}
	wg.Wait()
	clients := make([]v1.EnrollmentServiceClient, benchClients)
	for i := range clients {
		conn := cp.Dial(nil)
		conn.Connect()
		for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
			if !conn.WaitForStateChange(ctx, s) {
				b.Fatal("client connection did not become ready")
			}
		}
		clients[i] = v1.NewEnrollmentServiceClient(conn)
	}

	lat := make([][]time.Duration, benchClients)
	next.Store(0)
	b.ResetTimer()
	start := time.Now()
	for w := range clients {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < b.N; i = int(next.Add(1) - 1) {
				t := time.Now()
				if _, err := clients[w].Enroll(ctx, &v1.EnrollRequest{Token: tokens[i], CsrPem: csrs[i]}); err != nil {
					b.Errorf("enroll %d: %v", i, err)
					return
				}
				lat[w] = append(lat[w], time.Since(t))
			}
		}(w)
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	if len(all) != b.N {
		b.Fatalf("%d enrollments, want %d", len(all), b.N)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "enrollments/s")
	b.ReportMetric(ms(all[(len(all)-1)*50/100]), "p50_ms")
	b.ReportMetric(ms(all[(len(all)-1)*99/100]), "p99_ms")
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
