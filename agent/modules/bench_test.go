package modules

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tetherfleet/tether/agent/enroll/enrolltest"
)

const benchModuleSize = 64 << 20

// benchDir puts the cache on tmpfs when there is one, as on a node (/run).
func benchDir(b *testing.B) string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", "tether-bench-"); err == nil {
			b.Cleanup(func() { os.RemoveAll(d) })
			return d
		}
	}
	return b.TempDir()
}

// BenchmarkFetchVerify measures fetch + streaming verification through an
// in-process gRPC server over loopback mTLS, as a node fetches, and reports
// it against in-memory SHA-256 of the same bytes measured in the same run:
//
//   - x-sha256: throughput / SHA-256 throughput (the goal is >= 0.8);
//   - cpu-x-sha256: CPU time per module (agent and in-process server
//     together) / CPU time to hash it, which is steadier than wall time on
//     a shared machine.
//
// The server shares the machine's cores with the agent here; on a node it
// does not.
func BenchmarkFetchVerify(b *testing.B) {
	for _, chunk := range []int{256 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("chunk=%dKiB", chunk>>10), func(b *testing.B) {
			// The server writes in 256 KiB buffers, as a server streaming
			// large messages should; the agent keeps gRPC's defaults (its
			// flow-control windows grow with the bandwidth-delay product,
			// which a static window would cap on a long link).
			e := newEnv(b, benchDir(b), enrolltest.WithGRPCOptions(grpc.WriteBufferSize(256<<10)))
			blob := randomBytes(b, benchModuleSize)
			m := e.addModule("bench", blob)
			e.srv.Lock()
			e.srv.ChunkSize = chunk
			e.srv.Unlock()
			f := e.fetcher(b, &recorder{})
			path, _ := f.Path(m.Digest)
			shaRate := sha256Rate(blob)

			b.SetBytes(benchModuleSize)
			b.ResetTimer()
			cpu0 := cpuTime()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
					b.Fatal(err)
				}
				if _, err := f.Fetch(context.Background(), m); err != nil {
					b.Fatal(err)
				}
			}
			elapsed := time.Since(start)
			cpu := cpuTime() - cpu0
			b.StopTimer()
			rate := float64(b.N) * benchModuleSize / elapsed.Seconds()
			b.ReportMetric(rate/shaRate, "x-sha256")
			b.ReportMetric(shaRate/1e6, "sha256-MB/s")
			b.ReportMetric(cpu.Seconds()/float64(b.N)/(benchModuleSize/shaRate), "cpu-x-sha256")
		})
	}
}

// BenchmarkSHA256InMemory is the peer: hashing the bytes already in memory.
func BenchmarkSHA256InMemory(b *testing.B) {
	blob := randomBytes(b, benchModuleSize)
	b.SetBytes(benchModuleSize)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		sha256.Sum256(blob)
	}
}

// sha256Rate is the best of a few timed in-memory hashes, in bytes/s.
func sha256Rate(blob []byte) float64 {
	best := time.Duration(1<<63 - 1)
	for i := 0; i < 3; i++ {
		start := time.Now()
		sha256.Sum256(blob)
		best = min(best, time.Since(start))
	}
	return float64(len(blob)) / best.Seconds()
}

// cpuTime is the process's user + system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
