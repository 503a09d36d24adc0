// Package fetchbench measures module fetch + verify throughput the same way
// against the fake control plane (agent/modules) and the real tetherd (e2e),
// so the two numbers compare. It is for benchmarks only.
package fetchbench

import (
	"crypto/sha256"
	"errors"
	"os"
	"runtime/pprof"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherfleet/tether/agent/boot"
)

// Dir returns a cache directory on a tmpfs mounted as a node mounts /run
// (huge pages) when running as root, else on /dev/shm.
// TETHER_BENCH_DIR overrides it.
func Dir(b *testing.B) string {
	parent := os.Getenv("TETHER_BENCH_DIR")
	if parent == "" && os.Geteuid() == 0 {
		// As root, mount the cache the way a node mounts /run (agent/boot),
		// so the benchmark measures the page size the product uses.
		d, err := os.MkdirTemp("", "tether-bench-run-")
		if err == nil {
			err = unix.Mount("tmpfs", d, "tmpfs", 0, boot.RunMountData)
			if errors.Is(err, unix.EINVAL) {
				err = unix.Mount("tmpfs", d, "tmpfs", 0, "mode=0755")
			}
			if err == nil {
				b.Cleanup(func() { _ = unix.Unmount(d, unix.MNT_DETACH); os.Remove(d) })
				return d
			}
			os.Remove(d)
		}
		b.Logf("could not mount a tmpfs like a node's /run (%v); using /dev/shm", err)
	}
	if parent == "" {
		if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
			parent = "/dev/shm"
		}
	}
	if parent != "" {
		if d, err := os.MkdirTemp(parent, "tether-bench-"); err == nil {
			b.Cleanup(func() { os.RemoveAll(d) })
			return d
		}
	}
	return b.TempDir()
}

// Run times b.N calls of fetch, each after reset (which removes the cached
// copy and is not timed: deleting a 64 MiB tmpfs file is not part of
// fetching one, and takes ~10 ms here), and reports, against in-memory
// SHA-256 of blob measured in the same run:
//
//   - x-sha256: fetch throughput / SHA-256 throughput (goal >= 0.5, stretch
//     0.8);
//   - cpu-x-sha256: CPU time per fetch (the whole process: agent and an
//     in-process server together) / CPU time to hash the module, which is
//     steadier than wall time on a shared machine;
//   - cpu-ms/op: that CPU time in milliseconds.
//
// Each peer fetches the same bytes after every one of the agent's fetches,
// untimed by b, so the two alternate under the same machine load; each
// reports <name>-x-sha256 the same way.
//
// TETHER_BENCH_CPUPROFILE=file profiles the timed fetches alone (and
// leaves the peers out).
func Run(b *testing.B, blob []byte, reset, fetch func() error, peers ...Peer) {
	shaRate := SHA256Rate(blob)
	b.SetBytes(int64(len(blob)))
	var elapsed, cpu time.Duration
	peerElapsed := make([]time.Duration, len(peers))
	if path := os.Getenv("TETHER_BENCH_CPUPROFILE"); path != "" && b.N > 1 {
		stop := profile(b, path)
		defer stop()
		// The peers' server side runs in this process too: it would be in
		// the profile, which is of the agent's fetches.
		if len(peers) > 0 {
			b.Logf("profiling: the %d peers are not run", len(peers))
			peers = nil
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if err := reset(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		cpu0, start := CPUTime(), time.Now()
		if err := fetch(); err != nil {
			b.Fatal(err)
		}
		elapsed += time.Since(start)
		cpu += CPUTime() - cpu0
		b.StopTimer()
		for j, p := range peers {
			start := time.Now()
			if err := p.Fetch(); err != nil {
				b.Fatalf("peer %s: %v", p.Name, err)
			}
			peerElapsed[j] += time.Since(start)
		}
		b.StartTimer()
	}
	b.StopTimer()
	rate := float64(b.N) * float64(len(blob)) / elapsed.Seconds()
	b.ReportMetric(rate/shaRate, "x-sha256")
	for j, p := range peers {
		b.ReportMetric(float64(b.N)*float64(len(blob))/peerElapsed[j].Seconds()/shaRate, p.Name+"-x-sha256")
	}
	b.ReportMetric(shaRate/1e6, "sha256-MB/s")
	b.ReportMetric(cpu.Seconds()/float64(b.N)/(float64(len(blob))/shaRate), "cpu-x-sha256")
	b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/op")
}

// Peer is another client fetching the same bytes (curl from the netboot
// HTTP server, say), measured beside the agent's fetcher.
type Peer struct {
	Name  string // the metric is <Name>-x-sha256
	Fetch func() error
}

// profile writes a CPU profile of the timed fetches alone (-cpuprofile
// also covers making and pushing the module).
func profile(b *testing.B, path string) (stop func()) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}

// SHA256Rate is the best of a few timed in-memory hashes, in bytes/s.
func SHA256Rate(blob []byte) float64 {
	best := time.Duration(1<<63 - 1)
	for i := 0; i < 3; i++ {
		start := time.Now()
		sha256.Sum256(blob)
		best = min(best, time.Since(start))
	}
	return float64(len(blob)) / best.Seconds()
}

// CPUTime is the process's user + system CPU time.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
