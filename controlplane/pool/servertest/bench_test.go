package servertest

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/postgres"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/internal/testkit/pgtest"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	"github.com/tetherfleet/tether/internal/tools/bench"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// pgDurable keeps fsync on, as SQLite's synchronous=FULL does; only the
// benchmarks start it.
var pgDurable = pgtest.Shared{Options: pgtest.Options{Durable: true}}

// BenchmarkAcquireAPI is BenchmarkAcquire (controlplane/pool) through a
// real tetherd: AcquirePoolMember over TLS on loopback, claimers sharing
// one client connection, against a 1,000-member pool seeded straight into
// the store. Run with -benchtime 3x.
func BenchmarkAcquireAPI(b *testing.B) {
	const members = 1000
	for _, be := range []struct {
		name  string
		start func(b *testing.B) (*testcp.ControlPlane, store.Store)
	}{
		{"sqlite", func(b *testing.B) (*testcp.ControlPlane, store.Store) {
			cp := testcp.Start(b)
			st, err := sqlite.Open(context.Background(), filepath.Join(cp.DataDir, daemon.SQLiteFile))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { st.Close() })
			return cp, st
		}},
		{"postgres", func(b *testing.B) (*testcp.ControlPlane, store.Store) {
			dsn := pgDurable.DSN(b)
			cp := testcp.Start(b, testcp.WithStore(dsn))
			st, err := postgres.Open(context.Background(), dsn, postgres.Options{})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { st.Close() })
			return cp, st
		}},
	} {
		for _, c := range []int{1, 8, 32} {
			b.Run(fmt.Sprintf("%s/claimers=%d", be.name, c), func(b *testing.B) {
				ctx := context.Background()
				cp, st := be.start(b)
				fleet := cp.SeedFleet(ctx, "bench")
				newPool := func(name string, n int) *v1.Pool {
					p, err := cp.Admin.CreatePool(ctx, &v1.CreatePoolRequest{Name: name, Template: fleet.Template, Provider: "qemu"})
					if err != nil {
						b.Fatal(err)
					}
					seedBench(b, ctx, st, p, n)
					return p
				}
				claimAPI(b, cp, newPool("warm-up", 4*c), c)
				var lat []time.Duration
				var elapsed time.Duration
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					p := newPool(fmt.Sprintf("bench-%d", i), members)
					b.StartTimer()
					got, d := claimAPI(b, cp, p, c)
					if len(got) != members {
						b.Fatalf("claimed %d of %d", len(got), members)
					}
					lat, elapsed = append(lat, got...), elapsed+d
				}
				b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "claims/s")
				b.ReportMetric(float64(bench.Percentile(lat, 0.50).Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(bench.Percentile(lat, 0.99).Microseconds())/1000, "p99-ms")
			})
		}
	}
}

func claimAPI(b *testing.B, cp *testcp.ControlPlane, p *v1.Pool, c int) ([]time.Duration, time.Duration) {
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
				_, err := cp.Admin.AcquirePoolMember(context.Background(), &v1.AcquirePoolMemberRequest{PoolId: p.Id, AcquiredBy: fmt.Sprintf("bench-%d", w)})
				d := time.Since(t)
				if status.Code(err) == codes.ResourceExhausted {
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

func seedBench(b *testing.B, ctx context.Context, st store.Store, p *v1.Pool, n int) {
	b.Helper()
	for start := 0; start < n; start += 250 {
		err := st.Tx(ctx, func(q store.Queries) error {
			for i := start; i < min(n, start+250); i++ {
				node := &store.Node{Name: fmt.Sprintf("%s-seed-%05d", p.Name, i), TemplateID: store.TemplateID(p.TemplateId), Enabled: true,
					Config: []byte("{}"), CreatedAt: t0, UpdatedAt: t0}
				if err := q.CreateNode(ctx, node); err != nil {
					return err
				}
				w := t0.Add(time.Duration(i) * time.Millisecond)
				in := &store.Instance{NodeID: node.ID, Status: lifecycle.Running, Provider: "qemu",
					CloudInstanceID: node.Name, CreatedAt: w, UpdatedAt: w, PoolMember: store.PoolMember{PoolID: store.PoolID(p.Id), PoolState: lifecycle.PoolReady, PoolWarmingStartedAt: &w, PoolReadyAt: &w}, AgentReport: store.AgentReport{LastHeartbeatAt: &w, Addresses: []string{"10.9.0.1"}}}
				if err := q.CreateInstance(ctx, in); err != nil {
					return err
				}
				// Its agent counts as connected for the whole run.
				if err := q.OpenPresence(ctx, &store.Presence{InstanceID: in.ID, Replica: "seed", StreamID: "s-" + in.ID.String(), ConnectedAt: w,
					LeaseUntil: w.Add(100 * 365 * 24 * time.Hour)}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}
