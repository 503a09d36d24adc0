package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// pollInterval is how often we look at a process we cannot wait for (one a
// previous control plane started) and at a QMP socket that is coming up.
const pollInterval = 50 * time.Millisecond

// readPID reads an instance's pid file; a missing file is pid 0, nil.
func readPID(path string) (int, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("pid file %s: bad content %q", path, b)
	}
	return pid, nil
}

// writePID writes the pid file atomically, so a reader never sees a
// half-written number.
func writePID(path string, pid int) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(pid)+"\n"), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// processIsVM reports whether pid is alive and is the QEMU of this
// instance. A zombie counts as dead: after a control plane restart the VM is
// no longer our child, and whoever inherited it may not have reaped it yet.
// The command line check guards against pid reuse.
func processIsVM(pid int, qmpArg string) bool {
	if pid <= 0 {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the last ')' because the command name may itself
	// contain spaces and parentheses.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) {
		return false
	}
	if s := stat[i+2]; s == 'Z' || s == 'X' || s == 'x' {
		return false
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	for _, a := range bytes.Split(cmdline, []byte{0}) {
		if string(a) == qmpArg {
			return true
		}
	}
	return false
}

// findVM scans the process table for the QEMU whose command line carries
// qmpArg, and returns its pid or 0.
func findVM(qmpArg string) int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if processIsVM(pid, qmpArg) {
			return pid
		}
	}
	return 0
}

// proc is a QEMU process this provider started, so it can be waited for
// rather than polled.
type proc struct {
	pid  int
	done chan struct{}
	err  error // set before done is closed
	// tpmDied: the VM's swtpm had exited before QEMU did (set before done
	// is closed).
	tpmDied bool
}

// waitExit waits up to timeout (and ctx) for the instance's VM process to
// die. It reports whether the process is gone.
func (r *realDriver) waitExit(ctx context.Context, id string, pid int, qmpArg string, timeout time.Duration) bool {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	r.mu.Lock()
	pr := r.procs[id]
	r.mu.Unlock()
	if pr != nil && pr.pid == pid {
		select {
		case <-pr.done:
			return true
		case <-timer.C:
		case <-ctx.Done():
		}
		return !processIsVM(pid, qmpArg)
	}
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		if !processIsVM(pid, qmpArg) {
			return true
		}
		select {
		case <-tick.C:
		case <-timer.C:
			return !processIsVM(pid, qmpArg)
		case <-ctx.Done():
			return !processIsVM(pid, qmpArg)
		}
	}
}

// halt brings a running VM down: an ACPI powerdown with StopGrace to act
// when graceful, then QMP quit, then SIGKILL. It judges success by the
// process, not by what QMP answered, and returns an error only when the
// process is still alive at the end.
func (r *realDriver) halt(ctx context.Context, op, id string, pid int, graceful bool) error {
	p := pathsFor(r.cfg.StateDir, id)
	log := r.log.With("instance", id, "pid", pid, "op", op)
	if graceful {
		if _, err := qmpRun(ctx, p.qmp, r.cfg.QMPTimeout, "system_powerdown"); err != nil {
			log.Warn("qemu powerdown failed; quitting instead", "err", err)
		} else if r.waitExit(ctx, id, pid, p.qmpArg(), r.cfg.StopGrace) {
			return nil
		}
	}
	if err := ctx.Err(); err != nil {
		return errs.Transient(op, id, fmt.Errorf("halting pid %d: %w", pid, err))
	}
	if _, err := qmpRun(ctx, p.qmp, r.cfg.QMPTimeout, "quit"); err != nil && !quitLost(err) {
		log.Warn("qemu quit failed; killing", "err", err)
	}
	if r.waitExit(ctx, id, pid, p.qmpArg(), r.cfg.KillTimeout) {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return errs.Transient(op, id, fmt.Errorf("halting pid %d: %w", pid, err))
	}
	log.Warn("qemu still alive after quit; sending SIGKILL")
	// Re-check identity right before the signal: the pid must still be our
	// VM, never a process that inherited the number.
	if processIsVM(pid, p.qmpArg()) {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return errs.Transient(op, id, fmt.Errorf("kill pid %d: %w", pid, err))
		}
	}
	if r.waitExit(ctx, id, pid, p.qmpArg(), r.cfg.KillTimeout) {
		return nil
	}
	return errs.Transient(op, id, fmt.Errorf("qemu pid %d still alive after SIGKILL", pid))
}
