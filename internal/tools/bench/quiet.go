package bench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// SelfCPU is the user+system CPU this process has used (getrusage), so a
// load generator can report what it cost per request.
func SelfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Sample measures this process's CPU over the timed phase only.
type Sample struct{ start time.Duration }

// Start begins the sample.
func (s *Sample) Start() { s.start = SelfCPU() }

// Stop is the CPU used since Start.
func (s *Sample) Stop() time.Duration { return SelfCPU() - s.start }

// pfKthread marks kernel threads in /proc/PID/stat's flags field.
const pfKthread = 0x00200000

// Foreign reads the CPU that userland processes other than the measured
// ones use, from /proc: on a shared machine a run is only worth its number
// when nobody else took the cores from it. Kernel threads are left out
// (the benchmark's own fsyncs and loopback traffic keep them busy);
// children reaped by their parent are caught through cutime and cstime.
type Foreign struct {
	// Exclude holds the measured processes (the server, the load
	// generator, its parent).
	Exclude map[int]bool
	proc    string // /proc; tests point it elsewhere
}

// ForeignSnapshot is one reading.
type ForeignSnapshot struct {
	at    time.Time
	ticks map[int]int64
}

// Snapshot reads every process's CPU now.
func (f *Foreign) Snapshot() ForeignSnapshot {
	proc := f.proc
	if proc == "" {
		proc = "/proc"
	}
	s := ForeignSnapshot{at: time.Now(), ticks: map[int]int64{}}
	ents, err := os.ReadDir(proc)
	if err != nil {
		return s
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || f.Exclude[pid] {
			continue
		}
		b, err := os.ReadFile(proc + "/" + e.Name() + "/stat")
		if err != nil {
			continue // gone since the listing
		}
		if t, ok := userTicks(string(b)); ok {
			s.ticks[pid] = t
		}
	}
	return s
}

// userTicks is utime+stime+cutime+cstime of a userland process's stat
// line (false for kernel threads and lines it cannot read).
func userTicks(stat string) (int64, bool) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 || i+2 > len(stat) {
		return 0, false
	}
	f := strings.Fields(stat[i+2:]) // f[k] is field k+3
	if len(f) < 15 {
		return 0, false
	}
	flags, err := strconv.ParseUint(f[6], 10, 64)
	if err != nil || flags&pfKthread != 0 {
		return 0, false
	}
	var t int64
	for _, k := range []int{11, 12, 13, 14} {
		x, err := strconv.ParseInt(f[k], 10, 64)
		if err != nil {
			return 0, false
		}
		t += x
	}
	return t, true
}

// Cores is the average number of cores the other processes used between
// two snapshots. A process that started in between counts whole.
func (a ForeignSnapshot) Cores(b ForeignSnapshot) float64 {
	d := b.at.Sub(a.at).Seconds()
	if d <= 0 {
		return 0
	}
	var ticks int64
	for pid, tb := range b.ticks {
		if ta, ok := a.ticks[pid]; ok {
			ticks += max(0, tb-ta)
		} else {
			ticks += tb
		}
	}
	return float64(ticks) / 100 / d // USER_HZ is 100 on Linux
}

// LoadAverage is /proc/loadavg's first three fields, as uptime prints them.
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return fmt.Sprintf("%s %s %s", f[0], f[1], f[2])
}
