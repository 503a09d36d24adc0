package tasks

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Registry tracks the children the agent waits for itself (exec tasks,
// the debug shell), so that as PID 1 it can reap every other zombie it
// inherits without stealing an exit status os/exec is waiting for. A nil
// Registry tracks nothing.
type Registry struct {
	mu    sync.Mutex
	owned map[int]bool
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{owned: map[int]bool{}} }

// Start starts cmd and records it as owned, under the lock Reap takes, so
// a child that exits at once is never mistaken for an orphan.
func (r *Registry) Start(cmd *exec.Cmd) error { return r.start(cmd) }

// Release forgets pid once cmd.Wait has returned.
func (r *Registry) Release(pid int) { r.release(pid) }

func (r *Registry) start(cmd *exec.Cmd) error {
	if r == nil {
		return cmd.Start()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	r.owned[cmd.Process.Pid] = true
	return nil
}

func (r *Registry) release(pid int) {
	if r == nil {
		return
	}
	r.mu.Lock()
	delete(r.owned, pid)
	r.mu.Unlock()
}

// Reap collects every zombie child of this process that it does not own.
// It reads /proc rather than calling wait(-1), which could take an owned
// child's status. It returns how many it reaped.
func (r *Registry) Reap(proc string) int {
	if r == nil {
		return 0
	}
	if proc == "" {
		proc = "/proc"
	}
	self := os.Getpid()
	entries, err := os.ReadDir(proc)
	if err != nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || r.owned[pid] {
			continue
		}
		stat, err := os.ReadFile(filepath.Join(proc, e.Name(), "stat"))
		if err != nil {
			continue
		}
		state, ppid, ok := parseStat(string(stat))
		if !ok || state != "Z" || ppid != self {
			continue
		}
		var ws unix.WaitStatus
		if p, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); err == nil && p == pid {
			n++
		}
	}
	return n
}

// parseStat extracts state and ppid from /proc/PID/stat; the command name
// in parentheses may itself contain spaces and parentheses.
func parseStat(s string) (state string, ppid int, ok bool) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return "", 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return f[0], ppid, err == nil
}
