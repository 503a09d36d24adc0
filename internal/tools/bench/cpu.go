package bench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ProcessCPU is the user+system CPU time a process has used, from
// /proc/PID/stat (fields 14 and 15, in clock ticks of 1/100 s on Linux).
func ProcessCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("read cpu of pid %d: %w", pid, err)
	}
	// The command name (field 2) may hold spaces; fields resume after ')'.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(fields) < 13 {
		return 0, fmt.Errorf("read cpu of pid %d: short stat line", pid)
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("read cpu of pid %d: bad stat fields", pid)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// ProcessRSS is a process's resident set size in bytes (VmRSS).
func ProcessRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("read rss of pid %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("read rss of pid %d: %w", pid, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("read rss of pid %d: no VmRSS", pid)
}
