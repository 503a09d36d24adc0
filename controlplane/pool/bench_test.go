package pool_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/pool"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/testkit/instancestest"
	"github.com/tetherfleet/tether/internal/tools/bench"
)

// BenchmarkAcquire measures claims against a 1,000-member pool: each
// iteration seeds 1,000 ready members (untimed, straight into the store),
// then C claimers take them all through pool.Service.Acquire, each claim a
// transaction with its pool.claimed event, durably committed (SQLite
// synchronous=FULL; PostgreSQL with fsync on), after a warm-up round that
// opens the connections a running control plane would have open. Run with
// -benchtime 3x. Each case runs twice: batched (the service as it is) and
// tx-per-claim, the same claims with batching off, as the peer measured
// in the same run on the same (shared, noisy) machine.
func BenchmarkAcquire(b *testing.B) {
	const members = 1000
	modes := []struct {
		name string
		set  func(*pool.Service, int)
	}{
		{"batched", func(*pool.Service, int) {}},
		// The peer: one transaction per claim, all claimers at once.
		{"tx-per-claim", func(s *pool.Service, c int) { s.ClaimBatch, s.ClaimLanes = 1, c }},
	}
	for _, be := range []backend{{"sqlite", instancestest.SQLite}, {"postgres", openPostgres(&pgDurable)}} {
		for _, c := range []int{1, 8, 32} {
			for _, mode := range modes {
				b.Run(fmt.Sprintf("%s/claimers=%d/%s", be.name, c, mode.name), func(b *testing.B) {
					e := newEnv(b, be.open)
					mode.set(e.svc, c)
					// Warm up: a running control plane has its connections open
					// (the first claims would otherwise pay for dialing them).
					warm := e.create("warm-up", 0, store.PoolMetadata{})
					seedReady(b, e.ctx, e.st, warm, 4*c)
					claimAll(b, e, warm, c)
					var lat []time.Duration
					var elapsed time.Duration
					for i := 0; i < b.N; i++ {
						b.StopTimer()
						p := e.create(fmt.Sprintf("bench-%d", i), 0, store.PoolMetadata{})
						seedReady(b, e.ctx, e.st, p, members)
						b.StartTimer()
						got, d := claimAll(b, e, p, c)
						elapsed += d
						lat = append(lat, got...)
						if len(got) != members {
							b.Fatalf("claimed %d of %d", len(got), members)
						}
					}
					b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "claims/s")
					b.ReportMetric(float64(bench.Percentile(lat, 0.50).Microseconds())/1000, "p50-ms")
					b.ReportMetric(float64(bench.Percentile(lat, 0.99).Microseconds())/1000, "p99-ms")
				})
			}
		}
	}
}

// claimAll runs c claimers until the pool has no ready member and returns
// the latency of every successful claim and the wall time taken.
func claimAll(b *testing.B, e *env, p *store.Pool, c int) ([]time.Duration, time.Duration) {
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < c; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			var mine []time.Duration
			for {
				t := time.Now()
				_, err := e.svc.Acquire(e.ctx, pool.AcquireParams{PoolID: p.ID, AcquiredBy: fmt.Sprintf("bench-%d", w)})
				d := time.Since(t)
				if fail.Code(err) == codes.ResourceExhausted {
					break
				}
				if err != nil {
					b.Error(err)
					break
				}
				mine = append(mine, d)
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}(w)
	}
	wg.Wait()
	return lat, time.Since(start)
}
