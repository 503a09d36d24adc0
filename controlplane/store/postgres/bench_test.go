package postgres_test

import (
	"context"
	"errors"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/postgres"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/controlplane/store/storetest"
)

// benchClients is the number of concurrent claimers.
const benchClients = 64

// BenchmarkTaskClaim: 64 concurrent clients lease b.N pending tasks, one
// transaction per claim (as the agent stream and the worker loop do), on
// each backend. Run it with a fixed count so both backends do the same
// work:
//
//	go test -tags nobadger,nobbolt,nomysql -run '^$' -bench TaskClaim -benchtime 5000x ./controlplane/store/postgres/
func BenchmarkTaskClaim(b *testing.B) {
	for _, bc := range []struct {
		name string
		open func(b *testing.B) store.Store
	}{
		{"sqlite", func(b *testing.B) store.Store {
			s, err := sqlite.Open(context.Background(), filepath.Join(b.TempDir(), "tether.db"))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return s
		}},
		{"postgres", func(b *testing.B) store.Store { return open(b, pgDurable.DSN(b), postgres.Options{}) }},
	} {
		b.Run(bc.name, func(b *testing.B) { benchClaims(b, bc.open(b)) })
	}
}

func benchClaims(b *testing.B, s store.Store) {
	ctx := context.Background()
	// Seed in batches: the seeding is not what is measured.
	for i := 0; i < b.N; {
		err := s.Tx(ctx, func(q store.Queries) error {
			for j := 0; j < 500 && i+j < b.N; j++ {
				if err := q.CreateTask(ctx, workerTask(i+j)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		i += 500
	}
	lat := make([][]time.Duration, benchClients)
	var claimed atomic.Int64
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < benchClients; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			owner := "worker-" + strconv.Itoa(w)
			for claimed.Load() < int64(b.N) {
				t := time.Now()
				err := s.Tx(ctx, func(q store.Queries) error {
					_, err := q.ClaimTask(ctx, store.TaskClaim{Target: store.TaskTargetWorker, Owner: owner, Now: t0, LeaseUntil: t0.Add(time.Hour)})
					return err
				})
				if err != nil {
					if !errors.Is(err, store.ErrNotFound) {
						b.Error(err)
					}
					return
				}
				lat[w] = append(lat[w], time.Since(t))
				claimed.Add(1)
			}
		}(w)
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	all := make([]time.Duration, 0, b.N)
	for _, l := range lat {
		all = append(all, l...)
	}
	if len(all) != b.N {
		b.Fatalf("%d claims, want %d", len(all), b.N)
	}
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "claims/s")
	b.ReportMetric(ms(percentile(all, 50)), "p50_ms")
	b.ReportMetric(ms(percentile(all, 99)), "p99_ms")
}

func percentile(d []time.Duration, p int) time.Duration {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[(len(d)-1)*p/100]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkRecordHeartbeats: see storetest.BenchRecordHeartbeats. It runs
// on the durable server (fsync on), as SQLite's synchronous=FULL does.
//
//	nice -n 10 go test -tags nobadger,nobbolt,nomysql -run '^$' -bench RecordHeartbeats -benchtime 2s -count 3 ./controlplane/store/postgres/
func BenchmarkRecordHeartbeats(b *testing.B) {
	storetest.BenchRecordHeartbeats(b, open(b, pgDurable.DSN(b), postgres.Options{}))
}
