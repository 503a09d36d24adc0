package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
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
// on the durable server (fsync on), as SQLite's synchronous=FULL does, and
// reports the server's CPU per heartbeat besides this process's.
//
//	nice -n 10 go test -tags nobadger,nobbolt,nomysql -run '^$' -bench RecordHeartbeats -benchtime 2s -count 3 ./controlplane/store/postgres/
func BenchmarkRecordHeartbeats(b *testing.B) {
	s := open(b, pgDurable.DSN(b), postgres.Options{})
	dataDir := filepath.Join(pgDurable.Server(b).Dir, "data")
	storetest.BenchRecordHeartbeats(b, s, func() (time.Duration, error) { return postgresCPU(dataDir) })
}

// postgresCPU is the CPU time of the server whose data directory is
// dataDir: the postmaster's own and that of its children, live (from
// /proc) and exited (the postmaster reaped them into its cutime/cstime).
// A backend that exits between the two reads may be counted twice or not
// at all; over a benchmark's thousands of heartbeats and its fixed pool of
// connections that is noise.
func postgresCPU(dataDir string) (time.Duration, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("find the postmaster: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		return 0, fmt.Errorf("postmaster.pid: %w", err)
	}
	own, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	ticks := own.ticks + own.childTicks
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, fmt.Errorf("list processes: %w", err)
	}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil || p == pid {
			continue
		}
		st, err := procStat(p)
		if err != nil {
			continue // exited while we looked: reaped into the postmaster's cutime
		}
		if st.ppid == pid {
			ticks += st.ticks
		}
	}
	// USER_HZ is 100 on every Linux ABI Go supports.
	return time.Duration(ticks) * (time.Second / 100), nil
}

type procCPU struct {
	ppid              int
	ticks, childTicks int64
}

// procStat reads /proc/pid/stat: fields 4 (ppid), 14-15 (utime, stime)
// and 16-17 (cutime, cstime), counted after the ")" that ends the
// command name, which may itself hold spaces.
func procStat(pid int) (procCPU, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procCPU{}, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procCPU{}, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 15 {
		return procCPU{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	var n [5]int64
	for j, k := range []int{1, 11, 12, 13, 14} {
		if n[j], err = strconv.ParseInt(f[k], 10, 64); err != nil {
			return procCPU{}, fmt.Errorf("/proc/%d/stat field %d: %w", pid, k+3, err)
		}
	}
	return procCPU{ppid: int(n[0]), ticks: n[1] + n[2], childTicks: n[3] + n[4]}, nil
}
