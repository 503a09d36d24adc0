package qemu

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// The swtpm of a VM runs beside its QEMU: started first (QEMU connects to
// its control socket at start-up and fails without it), stopped as soon as
// QEMU has exited. Like QEMU it runs in its own session, so it outlives a
// control plane restart together with its VM.

// swtpmPIDArg is the swtpm's --pid value. It doubles as the process's
// fingerprint, as the -qmp argument does for QEMU: it names the instance.
func (p instancePaths) swtpmPIDArg() string { return "file=" + p.tpmPID }

// swtpmArgv is the swtpm command line. The control socket is handed over
// as an open, listening descriptor (fd 3): QEMU can connect the moment it
// starts, with no wait for swtpm to create the socket, and no probe
// connection that swtpm could take for its client.
func swtpmArgv(bin, stateDir string, p instancePaths) []string {
	return []string{bin, "socket", "--tpm2",
		"--tpmstate", "dir=" + stateDir,
		"--ctrl", "type=unixio,fd=3",
		// Ends swtpm when QEMU's connection goes, whoever stopped QEMU.
		"--terminate",
		"--pid", p.swtpmPIDArg(),
	}
}

// nodeOf is the node recorded for the instance at Provision; "" when none
// was given.
func nodeOf(p instancePaths) (string, error) {
	b, err := os.ReadFile(p.node)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// tpmDirOf is the TPM an instance gets: its node's; for a machine without
// a node, one of its own inside its directory (gone with it).
func (r *realDriver) tpmDirOf(id string) (string, error) {
	p := r.paths(id)
	node, err := nodeOf(p)
	if err != nil {
		return "", fmt.Errorf("the VM's recorded node: %w", err)
	}
	if node == "" {
		return filepath.Join(p.dir, tpmDirName), nil
	}
	if !validID.MatchString(node) {
		return "", fmt.Errorf("recorded node %q is not a name of [A-Za-z0-9_.-]", node)
	}
	return TPMDir(r.cfg.StateDir, node), nil
}

// startTPM prepares the instance's TPM (once per node) and starts its
// swtpm. Callers hold the instance lock; a swtpm left from an earlier boot
// is stopped first, as two on one state would corrupt it.
func (r *realDriver) startTPM(ctx context.Context, op, id string) (*proc, string, error) {
	p := r.paths(id)
	dir, err := r.tpmDirOf(id)
	if err != nil {
		return nil, "", errs.Permanent(op, id, err)
	}
	ek, err := prepareTPM(ctx, dir)
	if err != nil {
		return nil, "", errs.Permanent(op, id, err)
	}
	if err := r.stopTPM(id); err != nil {
		return nil, "", errs.Transient(op, id, err)
	}
	state := filepath.Join(dir, tpmStateSubdir)
	if other := findVM("dir=" + state); other > 0 {
		// One TPM, one machine: a second swtpm on the state would fail
		// QEMU's TPM init with nothing but a result code. Another
		// instance of the node still runs (or is being stopped).
		return nil, "", errs.Transient(op, id, fmt.Errorf("the TPM %s is in use by another VM (swtpm pid %d): a node's instances cannot run at once", dir, other))
	}
	bin, err := exec.LookPath(swtpmBinary)
	if err != nil {
		return nil, "", errs.Permanent(op, id, fmt.Errorf("swtpm not found (install the swtpm package): %w", err))
	}
	if len(p.tpmSock) > maxSocketPath {
		return nil, "", errs.Permanent(op, id, fmt.Errorf("swtpm socket path %s is too long for a unix socket", p.tpmSock))
	}
	removeQuietly(p.tpmSock)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p.tpmSock, Net: "unix"})
	if err != nil {
		return nil, "", errs.Transient(op, id, fmt.Errorf("swtpm socket: %w", err))
	}
	// Our copies close below; the socket file must stay for QEMU.
	l.SetUnlinkOnClose(false)
	lf, err := l.File()
	l.Close()
	if err != nil {
		return nil, "", errs.Transient(op, id, fmt.Errorf("swtpm socket: %w", err))
	}
	defer lf.Close()

	logf, err := os.OpenFile(p.tpmLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, "", errs.Transient(op, id, fmt.Errorf("swtpm log: %w", err))
	}
	argv := swtpmArgv(bin, state, p)
	fmt.Fprintf(logf, "=== %s %s: %s\n", r.cfg.Clock.Now().UTC().Format(time.RFC3339), op, strings.Join(argv, " "))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = p.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{lf}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	logf.Close()
	if err != nil {
		return nil, "", errs.Permanent(op, id, fmt.Errorf("start swtpm: %w", err))
	}
	tp := &proc{pid: cmd.Process.Pid, done: make(chan struct{})}
	r.mu.Lock()
	r.tpms[id] = tp
	r.mu.Unlock()
	go func() {
		tp.err = cmd.Wait()
		close(tp.done)
		r.mu.Lock()
		if r.tpms[id] == tp {
			delete(r.tpms, id)
		}
		vm := r.procs[id]
		r.mu.Unlock()
		vmAlive := false
		if vm != nil {
			select {
			case <-vm.done:
			default:
				vmAlive = true
			}
		}
		if vmAlive {
			r.log.Error("swtpm exited while its VM runs: the guest has lost its TPM", "instance", id, "pid", tp.pid, "status", exitText(tp.err))
		} else {
			r.log.Info("swtpm exited", "instance", id, "pid", tp.pid, "status", exitText(tp.err))
		}
	}()
	if err := writePID(p.tpmPID, tp.pid); err != nil {
		r.killTPM(id, tp)
		return nil, "", errs.Transient(op, id, fmt.Errorf("write swtpm pid file: %w", err))
	}
	r.log.Info("swtpm started", "instance", id, "pid", tp.pid, "tpm", dir, "ek", ek)
	return tp, ek, nil
}

// tpmFailure names swtpm when it is why a launch failed (it died before
// its QEMU did): QEMU then only says it lost its TPM backend.
func tpmFailure(pr, tp *proc, p instancePaths) error {
	if tp == nil || !pr.tpmDied {
		return nil
	}
	return fmt.Errorf("swtpm exited during start-up (%s): %s", exitText(tp.err), logTail(p.tpmLog, 0))
}

// killTPM ends a swtpm we started whose QEMU never ran.
func (r *realDriver) killTPM(id string, tp *proc) {
	if err := r.endTPM(id, tp.pid, tp); err != nil {
		r.log.Error("swtpm", "instance", id, "err", err)
	}
}

// stopTPM ends the instance's swtpm, if one runs: ours or one an earlier
// control plane started (found by its pid file, else by its command line).
// QEMU is gone by now, so there is nothing to be graceful for beyond
// swtpm's own SIGTERM handling. It fails only when the process survives
// SIGKILL.
func (r *realDriver) stopTPM(id string) error {
	p := r.paths(id)
	fp := p.swtpmPIDArg()
	r.mu.Lock()
	tp := r.tpms[id]
	r.mu.Unlock()
	pid := 0
	n, perr := readPID(p.tpmPID)
	switch {
	case tp != nil:
		pid = tp.pid
	case perr == nil && processIsVM(n, fp):
		pid = n
	case r.cfg.TPM || n > 0:
		// No live pid file: a crash between starting swtpm and writing
		// it, or a damaged file. Look for the process itself. A provider
		// without TPMs whose instance never had one skips the scan.
		pid = findVM(fp)
	}
	if pid <= 0 || !processIsVM(pid, fp) {
		removeQuietly(p.tpmSock)
		removeQuietly(p.tpmPID)
		return nil
	}
	return r.endTPM(id, pid, tp)
}

// endTPM stops one swtpm process of the instance: SIGTERM, then SIGKILL,
// each given KillTimeout. tp is the process when we are its parent.
func (r *realDriver) endTPM(id string, pid int, tp *proc) error {
	p := r.paths(id)
	fp := p.swtpmPIDArg()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		// Re-check identity right before each signal: pids are reused.
		if processIsVM(pid, fp) {
			if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
				return fmt.Errorf("swtpm pid %d: %s: %w", pid, sig, err)
			}
		}
		if r.waitGone(tp, pid, fp, r.cfg.KillTimeout) {
			removeQuietly(p.tpmSock)
			removeQuietly(p.tpmPID)
			return nil
		}
		r.log.Warn("swtpm still alive", "instance", id, "pid", pid, "after", sig)
	}
	return fmt.Errorf("swtpm pid %d still alive after SIGKILL", pid)
}

// waitGone waits up to timeout for a process to die: on its reaper when we
// are its parent, else by polling the process table.
func (r *realDriver) waitGone(pr *proc, pid int, fp string, timeout time.Duration) bool {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	if pr != nil && pr.pid == pid {
		select {
		case <-pr.done:
			return true
		case <-timer.C:
			return !processIsVM(pid, fp)
		}
	}
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for processIsVM(pid, fp) {
		select {
		case <-tick.C:
		case <-timer.C:
			return !processIsVM(pid, fp)
		}
	}
	return true
}

// tpmDetail is the EK of the instance's TPM for its Machine.Detail; "" when
// the provider gives no TPMs or the TPM is not made yet.
func (r *realDriver) tpmDetail(id string) string {
	if h := r.ekHash(id); h != "" {
		return "tpm ek " + h
	}
	return ""
}

// ekHash is the EK hash of the instance's TPM; "" when there is none.
func (r *realDriver) ekHash(id string) string {
	if !r.cfg.TPM || !validID.MatchString(id) {
		return ""
	}
	dir, err := r.tpmDirOf(id)
	if err != nil {
		return ""
	}
	return cachedEKHash(dir)
}
