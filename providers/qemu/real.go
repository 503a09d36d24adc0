package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/internal/keyed"
	"github.com/tetherfleet/tether/providers/internal/operr"
)

// realDriver boots real QEMU processes. It keeps no machine state of its own
// beyond the processes it is currently parent of: every answer is read from
// the state directory, the process table and QMP, so a restarted control
// plane sees exactly what the previous one left running.
type realDriver struct {
	cfg   Config
	accel string
	log   *slog.Logger
	locks *keyed.Mutex

	mu    sync.Mutex
	procs map[string]*proc
	// tpms are the swtpm processes we are parent of (--qemu-tpm).
	tpms map[string]*proc
	// exits keeps, per instance, how its last child QEMU ended, so Status
	// can say what was observed (cleared when it is launched again).
	exits  map[string]string
	onExit func(providers.Exit)
}

// WatchExits implements providers.ExitWatcher: every QEMU child this
// driver reaps is reported, whether Tether stopped it or not, and so is
// the exit of every VM already running when it is called (found in the
// state dir, started by an earlier tetherd); the caller asks Status and
// judges by the row.
func (r *realDriver) WatchExits(ctx context.Context, f func(providers.Exit)) {
	r.mu.Lock()
	r.onExit = f
	r.mu.Unlock()
	r.watchAdopted(ctx)
	context.AfterFunc(ctx, func() {
		r.mu.Lock()
		r.onExit = nil
		r.mu.Unlock()
	})
}

// Exited implements providers.ExitReporter from what the reaper and the
// pidfd watch recorded and, for the moment before they run, from the
// process table: a QEMU that is a zombie or gone has exited, though its
// reaper has not woken yet. It takes no instance lock (a claim asks it
// inside its transaction, and must not wait behind a launch); a ready
// member is launched, so its pid file is written.
func (r *realDriver) Exited(id string) (string, bool) {
	r.mu.Lock()
	detail, exited := r.exits[id]
	r.mu.Unlock()
	if exited {
		return detail, true
	}
	p := r.paths(id)
	pid, err := readPID(p.pid)
	if err != nil || pid <= 0 {
		return "", false // no VM launched here: nothing known
	}
	if !processIsVM(pid, p.qmpArg()) {
		return fmt.Sprintf("qemu pid %d is no longer running", pid), true
	}
	return "", false
}

func newRealDriver(cfg Config, accel string) (*realDriver, error) {
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("qemu: state dir: %w", err)
	}
	return &realDriver{
		cfg:   cfg,
		accel: accel,
		log:   cfg.Logger,
		locks: keyed.New(),
		procs: map[string]*proc{},
		tpms:  map[string]*proc{},
		exits: map[string]string{},
	}, nil
}

func (r *realDriver) paths(id string) instancePaths { return pathsFor(r.cfg.StateDir, id) }

// observed is what the process table and the state directory say about an
// instance, before QMP is asked.
type observed struct {
	exists bool // instance directory present
	booted bool // a pid file was written: the machine has been launched once
	pid    int
	alive  bool
}

func (r *realDriver) observe(id string) (observed, error) {
	p := r.paths(id)
	if _, err := os.Stat(p.dir); errors.Is(err, os.ErrNotExist) {
		return observed{}, nil
	} else if err != nil {
		return observed{}, err
	}
	o := observed{exists: true}
	pid, err := readPID(p.pid)
	if err != nil {
		return o, err
	}
	o.booted = pid > 0
	o.pid = pid
	o.alive = processIsVM(pid, p.qmpArg())
	if !o.alive {
		// A control plane that died between starting QEMU and writing the
		// pid file (or a damaged pid file) must not make us launch a second
		// VM beside an orphan: look for the process by its QMP argument.
		if found := findVM(p.qmpArg()); found > 0 {
			r.log.Warn("qemu found without a valid pid file; adopting it", "instance", id, "pid", found)
			if err := writePID(p.pid, found); err != nil {
				r.log.Warn("qemu rewrite pid file", "instance", id, "err", err)
			}
			o.booted, o.pid, o.alive = true, found, true
		}
	}
	return o, nil
}

func (r *realDriver) Provision(ctx context.Context, spec providers.Spec) (providers.Machine, error) {
	id := spec.InstanceID
	if err := checkID(operr.Provision, id); err != nil {
		return providers.Machine{}, err
	}
	if err := checkBoot(r.cfg, operr.Provision, id, spec.Boot); err != nil {
		return providers.Machine{}, err
	}
	unlock, err := r.locks.Lock(ctx, id)
	if err != nil {
		return providers.Machine{}, errs.Transient(operr.Provision, id, err)
	}
	defer unlock()

	o, err := r.observe(id)
	if err != nil {
		return providers.Machine{}, errs.Transient(operr.Provision, id, err)
	}
	if o.booted {
		// Provision is idempotent by instance id: the machine exists, in
		// whatever state it is in now.
		return r.status(ctx, operr.Provision, id, o)
	}
	// No pid file: either a fresh instance or an attempt that died between
	// creating the directory and launching QEMU. Both are safe to launch.
	p := r.paths(id)
	if len(p.qmp) > maxSocketPath {
		return providers.Machine{}, errs.Permanent(operr.Provision, id, fmt.Errorf("QMP socket path %s is %d bytes, longer than a unix socket allows (%d): use a shorter state directory", p.qmp, len(p.qmp), maxSocketPath))
	}
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return providers.Machine{}, errs.Permanent(operr.Provision, id, fmt.Errorf("instance dir: %w", err))
	}
	if r.cfg.TPM && spec.Node != "" {
		if !validID.MatchString(spec.Node) {
			_ = os.RemoveAll(p.dir)
			return providers.Machine{}, errs.Permanent(operr.Provision, id, fmt.Errorf("node %q cannot name a TPM directory: want 1-64 of [A-Za-z0-9_.-], starting with a letter or digit", spec.Node))
		}
		if err := os.WriteFile(p.node, []byte(spec.Node), 0o600); err != nil {
			return providers.Machine{}, errs.Transient(operr.Provision, id, fmt.Errorf("record the node: %w", err))
		}
	}
	if r.cfg.Boot.Netboot() {
		if err := checkMAC(operr.Provision, id, spec.MAC); err != nil {
			_ = os.RemoveAll(p.dir)
			return providers.Machine{}, err
		}
		if err := os.WriteFile(p.mac, []byte(spec.MAC), 0o600); err != nil {
			return providers.Machine{}, errs.Transient(operr.Provision, id, fmt.Errorf("record the MAC: %w", err))
		}
	}
	m, err := r.launch(ctx, operr.Provision, id, spec.Boot)
	if err != nil {
		// Nothing was created that lives on: leave no directory, so the
		// machine reads gone, which is what it is.
		if rmErr := os.RemoveAll(p.dir); rmErr != nil {
			r.log.Warn("qemu provision: cleaning up after a failed launch", "instance", id, "err", rmErr)
		}
		return providers.Machine{}, err
	}
	return m, nil
}

func (r *realDriver) Start(ctx context.Context, id string, boot providers.Boot) (providers.Machine, error) {
	return r.boot(ctx, operr.Start, id, boot)
}

func (r *realDriver) Reboot(ctx context.Context, id string, boot providers.Boot) (providers.Machine, error) {
	return r.boot(ctx, operr.Reboot, id, boot)
}

// boot implements Start and Reboot. Both launch a new QEMU process: a fresh
// boot needs a fresh one-time token in fw_cfg, and a QMP system_reset would
// replay the spent one. Start leaves a running machine alone; Reboot halts
// it first, gracefully as Stop does (an ACPI powerdown that the agent turns
// into the root's own shutdown, then quit after StopGrace), so a real OS
// under a reboot shuts down cleanly. A Reboot of a machine whose process is
// gone simply boots it: the caller asked for a fresh boot and that is what
// it gets.
func (r *realDriver) boot(ctx context.Context, op, id string, boot providers.Boot) (providers.Machine, error) {
	if err := checkID(op, id); err != nil {
		return providers.Machine{}, err
	}
	if err := checkBoot(r.cfg, op, id, boot); err != nil {
		return providers.Machine{}, err
	}
	unlock, err := r.locks.Lock(ctx, id)
	if err != nil {
		return providers.Machine{}, errs.Transient(op, id, err)
	}
	defer unlock()

	o, err := r.observe(id)
	if err != nil {
		return providers.Machine{}, errs.Transient(op, id, err)
	}
	if !o.exists {
		return providers.Machine{}, notFound(op, id)
	}
	if o.alive {
		if op == operr.Start {
			return r.status(ctx, op, id, o)
		}
		if err := r.halt(ctx, op, id, o.pid, true); err != nil {
			return providers.Machine{}, err
		}
	}
	return r.launch(ctx, op, id, boot)
}

func (r *realDriver) Stop(ctx context.Context, id string) (providers.Machine, error) {
	if err := checkID(operr.Stop, id); err != nil {
		return providers.Machine{}, err
	}
	unlock, err := r.locks.Lock(ctx, id)
	if err != nil {
		return providers.Machine{}, errs.Transient(operr.Stop, id, err)
	}
	defer unlock()

	o, err := r.observe(id)
	if err != nil {
		return providers.Machine{}, errs.Transient(operr.Stop, id, err)
	}
	if !o.exists {
		return providers.Machine{}, notFound(operr.Stop, id)
	}
	if o.alive {
		if err := r.halt(ctx, operr.Stop, id, o.pid, true); err != nil {
			return providers.Machine{}, err
		}
		r.log.Info("qemu stopped", "instance", id, "pid", o.pid)
	}
	// A stopped VM has no use for its TPM; one that outlived a QEMU we
	// were not parent of (or a crash) ends here.
	if err := r.stopTPM(id); err != nil {
		return providers.Machine{}, errs.Transient(operr.Stop, id, err)
	}
	return r.machine(id, providers.StateStopped, ""), nil
}

func (r *realDriver) Terminate(ctx context.Context, id string) error {
	if err := checkID(operr.Terminate, id); err != nil {
		return err
	}
	unlock, err := r.locks.Lock(ctx, id)
	if err != nil {
		return errs.Transient(operr.Terminate, id, err)
	}
	defer unlock()

	o, err := r.observe(id)
	if err != nil {
		return errs.Transient(operr.Terminate, id, err)
	}
	if !o.exists {
		return nil
	}
	if o.alive {
		// Keep the directory when the process survives: the machine still
		// exists, and the pid file is how the next attempt finds it.
		if err := r.halt(ctx, operr.Terminate, id, o.pid, false); err != nil {
			return err
		}
	}
	// No swtpm may outlive its VM. The node's TPM state stays: it is the
	// node's, for its next instance.
	if err := r.stopTPM(id); err != nil {
		return errs.Transient(operr.Terminate, id, err)
	}
	if err := os.RemoveAll(r.paths(id).dir); err != nil {
		return errs.Transient(operr.Terminate, id, fmt.Errorf("remove instance dir: %w", err))
	}
	r.log.Info("qemu terminated", "instance", id)
	return nil
}

func (r *realDriver) Status(ctx context.Context, id string) (providers.Machine, error) {
	if err := checkID(operr.Status, id); err != nil {
		return providers.Machine{}, err
	}
	unlock, err := r.locks.Lock(ctx, id)
	if err != nil {
		return providers.Machine{}, errs.Transient(operr.Status, id, err)
	}
	defer unlock()
	o, err := r.observe(id)
	if err != nil {
		return providers.Machine{}, errs.Transient(operr.Status, id, err)
	}
	return r.status(ctx, operr.Status, id, o)
}

// status turns an observation into a Machine, asking QMP when the process is
// alive. Callers hold the instance lock.
func (r *realDriver) status(ctx context.Context, op, id string, o observed) (providers.Machine, error) {
	p := r.paths(id)
	switch {
	case !o.exists:
		return providers.Machine{ID: id, InstanceID: id, State: providers.StateGone}, nil
	case !o.alive:
		// A dead QEMU cannot read a token file any more; do not leave the
		// secret lying around (a crash between write and launch).
		removeQuietly(p.token)
		r.mu.Lock()
		detail := r.exits[id]
		r.mu.Unlock()
		if detail == "" {
			detail = "qemu process not running"
		}
		return r.machine(id, providers.StateStopped, detail), nil
	}
	out, err := qmpRun(ctx, p.qmp, r.cfg.QMPTimeout, "query-status")
	if err != nil {
		return providers.Machine{}, errs.Transient(op, id, fmt.Errorf("pid %d alive but QMP failed: %w", o.pid, err))
	}
	st, err := parseQueryStatus(out[0])
	if err != nil {
		return providers.Machine{}, errs.Transient(op, id, err)
	}
	// QMP answering means QEMU is past reading its fw_cfg files.
	removeQuietly(p.token)
	return r.machine(id, machineState(st), fmt.Sprintf("pid %d, qmp status %s, accel %s", o.pid, st.Status, r.accel)), nil
}

// machineState maps QMP's RunState to the provider's vocabulary.
func machineState(st vmStatus) providers.MachineState {
	switch st.Status {
	case "running":
		return providers.StateRunning
	case "paused", "suspended", "prelaunch":
		return providers.StatePaused
	}
	if st.Running {
		return providers.StateRunning
	}
	return providers.StateUnknown
}

func (r *realDriver) List(ctx context.Context) ([]providers.Machine, error) {
	entries, err := os.ReadDir(r.cfg.StateDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, errs.Transient(operr.List, "", fmt.Errorf("read state dir: %w", err))
	}
	var out []providers.Machine
	for _, e := range entries {
		if !e.IsDir() || !validID.MatchString(e.Name()) || e.Name() == tpmDirName {
			continue
		}
		m, err := r.Status(ctx, e.Name())
		if err != nil {
			if ctx.Err() != nil {
				return nil, errs.Transient(operr.List, "", ctx.Err())
			}
			// One wedged VM must not hide the others; it is listed as
			// unknown, which the sync loop leaves alone.
			m = r.machine(e.Name(), providers.StateUnknown, err.Error())
		}
		if m.State != providers.StateGone {
			out = append(out, m)
		}
	}
	return out, nil
}

func (r *realDriver) machine(id string, st providers.MachineState, detail string) providers.Machine {
	if t := r.tpmDetail(id); t != "" {
		detail += ", " + t
	}
	return providers.Machine{ID: id, InstanceID: id, State: st, Detail: detail}
}

// launch starts a QEMU process for the instance with the given boot and
// waits until QMP answers. Callers hold the instance lock and have made sure
// no QEMU runs for it.
func (r *realDriver) launch(ctx context.Context, op, id string, boot providers.Boot) (providers.Machine, error) {
	bin, err := exec.LookPath(r.cfg.Binary)
	if err != nil {
		return providers.Machine{}, errs.Permanent(op, id, fmt.Errorf("qemu binary %q not found (install the qemu-system-x86 package): %w", r.cfg.Binary, err))
	}
	p := r.paths(id)
	var mac string
	if r.cfg.Boot.Netboot() {
		b, err := os.ReadFile(p.mac)
		if err != nil {
			return providers.Machine{}, errs.Permanent(op, id, fmt.Errorf("the VM's recorded MAC: %w", err))
		}
		mac = string(b)
		if r.cfg.Boot.UEFI() {
			if err := ovmfVars(r.cfg.OVMFVars, p.ovmfVars); err != nil {
				return providers.Machine{}, errs.Permanent(op, id, err)
			}
			if _, err := os.Stat(r.cfg.OVMFCode); err != nil {
				return providers.Machine{}, errs.Permanent(op, id, fmt.Errorf("UEFI firmware (install the ovmf package): %w", err))
			}
		}
		// No kernel, no initramfs, no token: the firmware fetches them.
		boot.Enrollment.Token = ""
	} else {
		for _, f := range []struct{ what, path string }{{"kernel", boot.KernelPath}, {"initramfs", boot.InitramfsPath}} {
			if _, err := os.Stat(f.path); err != nil {
				return providers.Machine{}, errs.Permanent(op, id, fmt.Errorf("%s: %w", f.what, err))
			}
		}
	}
	if len(p.qmp) > maxSocketPath {
		return providers.Machine{}, errs.Permanent(op, id, fmt.Errorf("QMP socket path %s is too long for a unix socket", p.qmp))
	}

	// The token file exists only until QMP answers (or the launch fails).
	defer removeQuietly(p.token)
	withToken := boot.Enrollment.Token != ""
	if withToken {
		if err := writeSecret(p.token, boot.Enrollment.Token); err != nil {
			return providers.Machine{}, errs.Transient(op, id, fmt.Errorf("write token file: %w", err))
		}
	}
	// A socket file left by a dead QEMU would make us talk to nobody.
	removeQuietly(p.qmp)

	ls := launchSpec{
		Binary:     bin,
		InstanceID: id,
		Accel:      r.accel,
		MemoryMiB:  r.cfg.MemoryMiB,
		CPUs:       r.cfg.CPUs,
		Paths:      p,
		Kernel:     boot.KernelPath,
		Initramfs:  boot.InitramfsPath,
		KernelArgs: boot.KernelArgs,
		URL:        boot.Enrollment.ControlPlaneURL,
		CA:         boot.Enrollment.CAFingerprint,
		Signers:    boot.Signers,
		Instance:   boot.Enrollment.InstanceID,
		WithToken:  withToken,
	}
	if err := netbootLaunch(r.cfg, &ls, boot, mac); err != nil {
		return providers.Machine{}, errs.Permanent(op, id, err)
	}
	var tp *proc
	if r.cfg.TPM {
		if tp, _, err = r.startTPM(ctx, op, id); err != nil {
			return providers.Machine{}, err
		}
		ls.TPM = true
	}
	// Every failure from here on ends the swtpm we just started.
	launched := false
	defer func() {
		if tp != nil && !launched {
			r.killTPM(id, tp)
		}
	}()
	argv := buildArgv(ls)

	logf, err := os.OpenFile(p.qemuLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return providers.Machine{}, errs.Transient(op, id, fmt.Errorf("qemu log: %w", err))
	}
	logStart, _ := logf.Seek(0, io.SeekEnd)
	fmt.Fprintf(logf, "=== %s %s: %s\n", r.cfg.Clock.Now().UTC().Format(time.RFC3339), op, strings.Join(redact(argv, boot.Enrollment.Token), " "))

	// Not exec.CommandContext: the VM must outlive the request, and, in its
	// own session, the control plane too (a tetherd restart or a signal to
	// tetherd's process group must not take the fleet down).
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = p.dir
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	// The child has its own copy of the descriptor; holding ours for the
	// VM's lifetime would cost tetherd one fd per VM.
	logf.Close()
	if err != nil {
		kind := providers.KindTransient
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, os.ErrPermission) {
			kind = providers.KindPermanent
		}
		return providers.Machine{}, errs.Err(kind, op, id, fmt.Errorf("start qemu: %w", err))
	}
	pr := &proc{pid: cmd.Process.Pid, done: make(chan struct{})}
	r.mu.Lock()
	r.procs[id] = pr
	delete(r.exits, id)
	r.mu.Unlock()
	// From here the reaper owns the swtpm: it ends it with QEMU.
	launched = true
	// Reap the process while we are its parent, so it never lingers as a
	// zombie that looks alive to kill -0.
	go func() {
		pr.err = cmd.Wait()
		if tp != nil {
			select {
			case <-tp.done:
				pr.tpmDied = true
			default:
			}
			// Before done: whoever waits for the VM to be gone must find
			// its swtpm gone too.
			if err := r.endTPM(id, tp.pid, tp); err != nil {
				r.log.Error("swtpm outlived its VM", "instance", id, "err", err)
			}
		}
		close(pr.done)
		detail := exitDetail(pr.err)
		r.mu.Lock()
		if r.procs[id] == pr {
			delete(r.procs, id)
			r.exits[id] = detail
		}
		notify := r.onExit
		r.mu.Unlock()
		r.log.Info("qemu exited", "instance", id, "pid", pr.pid, "status", exitText(pr.err))
		if notify != nil {
			notify(providers.Exit{MachineID: id, InstanceID: id, Detail: detail})
		}
	}()

	log := r.log.With("instance", id, "pid", pr.pid, "op", op)
	log.Info("qemu launched", "accel", r.accel, "argv", redact(argv, boot.Enrollment.Token))

	if err := writePID(p.pid, pr.pid); err != nil {
		r.abort(pr)
		return providers.Machine{}, errs.Transient(op, id, fmt.Errorf("write pid file: %w", err))
	}

	st, err := r.awaitQMP(ctx, p, pr)
	if err != nil {
		select {
		case <-pr.done:
			// QEMU refused its command line or its files: retrying the same
			// boot will not help.
			qerr := fmt.Errorf("qemu exited during start-up (%s): %s", exitText(pr.err), logTail(p.qemuLog, logStart))
			if terr := tpmFailure(pr, tp, p); terr != nil {
				qerr = fmt.Errorf("%w; %w", terr, qerr)
			}
			return providers.Machine{}, errs.Permanent(op, id, qerr)
		default:
		}
		r.abort(pr)
		return providers.Machine{}, errs.Transient(op, id, err)
	}
	return r.machine(id, machineState(st), fmt.Sprintf("pid %d, qmp status %s, accel %s", pr.pid, st.Status, r.accel)), nil
}

// awaitQMP polls the new VM's QMP socket until query-status answers, the
// process exits, LaunchTimeout passes or ctx ends.
func (r *realDriver) awaitQMP(ctx context.Context, p instancePaths, pr *proc) (vmStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.LaunchTimeout)
	defer cancel()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	var lastErr error
	for {
		out, err := qmpRun(ctx, p.qmp, r.cfg.QMPTimeout, "query-status")
		if err == nil {
			return parseQueryStatus(out[0])
		}
		lastErr = err
		select {
		case <-pr.done:
			return vmStatus{}, errors.New("qemu exited")
		case <-ctx.Done():
			return vmStatus{}, fmt.Errorf("qemu pid %d did not answer on QMP within %s: %w (last: %v)", pr.pid, r.cfg.LaunchTimeout, ctx.Err(), lastErr)
		case <-tick.C:
		}
	}
}

// abort kills a VM we just launched and could not bring up, so a failed
// start leaves no half-booted machine holding a token.
//
// It deliberately ignores the caller's context, which has often ended by
// now: the kill must be waited for regardless.
func (r *realDriver) abort(pr *proc) {
	_ = syscall.Kill(pr.pid, syscall.SIGKILL)
	t := time.NewTimer(r.cfg.KillTimeout)
	defer t.Stop()
	select {
	case <-pr.done:
	case <-t.C:
		r.log.Error("qemu did not die after SIGKILL", "pid", pr.pid)
	}
}

// checkBoot refuses a boot that cannot work, before anything is created.
func checkBoot(cfg Config, op, id string, b providers.Boot) error {
	if cfg.Boot.Netboot() {
		if cfg.Tap == "" {
			if _, err := bootFileURL(b, "00:00:00:00:00:00"); err != nil {
				return errs.Permanent(op, id, err)
			}
		}
		return nil
	}
	if b.KernelPath == "" || b.InitramfsPath == "" {
		return errs.Permanent(op, id, errors.New("boot needs a kernel path and an initramfs path (direct kernel boot)"))
	}
	return nil
}

func bootFileURL(b providers.Boot, mac string) (string, error) {
	return providers.UserNetBootFile(b, mac)
}

func checkMAC(op, id, mac string) error {
	if err := providers.CheckNICAddress(mac); err != nil {
		return errs.Permanent(op, id, err)
	}
	return nil
}

// netbootLaunch fills in the netboot fields of a launch: the MAC, the
// network and, for UEFI, the firmware.
func netbootLaunch(cfg Config, s *launchSpec, b providers.Boot, mac string) error {
	s.Boot, s.Tap, s.MAC = cfg.Boot, cfg.Tap, mac
	if !cfg.Boot.Netboot() {
		return nil
	}
	if mac == "" {
		return errors.New("a netbooting VM needs a hardware address (the node's MAC), and none was given")
	}
	if cfg.Tap == "" {
		u, err := bootFileURL(b, mac)
		if err != nil {
			return err
		}
		if cfg.Boot == BootUEFIHTTP {
			// The firmware loads the image itself: no script between.
			u = strings.TrimSuffix(u, providers.BootScriptPath(mac)) + providers.UKIBootPath(mac)
		}
		s.BootFile = u
	}
	s.OVMFCode, s.SecureBoot = cfg.OVMFCode, cfg.SecureBoot
	return nil
}

// writeSecret writes a new 0600 file; it refuses to follow a planted
// symlink or reuse a file someone else created.
func writeSecret(path, content string) error {
	removeQuietly(path)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, werr := f.WriteString(content)
	cerr := f.Close()
	return errors.Join(werr, cerr)
}

func removeQuietly(path string) {
	_ = os.Remove(path)
}

// logTail returns what QEMU wrote since offset, trimmed to the last 2 KiB:
// that is where QEMU says why it refused to start.
func logTail(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		return "(no qemu log)"
	}
	defer f.Close()
	const max = 2048
	if fi, err := f.Stat(); err == nil && fi.Size()-offset > max {
		offset = fi.Size() - max
	}
	b, _ := io.ReadAll(io.NewSectionReader(f, offset, max))
	// The first line is our own header with the command line; the reason
	// is what follows it.
	s := string(b)
	if i := strings.IndexByte(s, '\n'); strings.HasPrefix(s, "=== ") && i >= 0 {
		s = s[i+1:]
	}
	s = strings.TrimSpace(s)
	if s == "" {
		return "(qemu printed nothing)"
	}
	return s
}

// exitDetail says how a QEMU child ended, in the shell's terms an
// operator knows: killed by a signal is 128 + its number.
func exitDetail(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return fmt.Sprintf("qemu killed by signal %d (%s, exit status %d)", int(ws.Signal()), ws.Signal(), 128+int(ws.Signal()))
		}
		return fmt.Sprintf("qemu exit status %d", ee.ExitCode())
	}
	if err != nil {
		return "qemu exited: " + err.Error()
	}
	return "qemu exit status 0"
}

func exitText(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// consolePath is where the serial console of an instance is written.
func consolePath(stateDir, id string) string {
	if !validID.MatchString(id) {
		return ""
	}
	return filepath.Join(stateDir, id, consoleLogFile)
}

// ovmfVars gives the VM its own UEFI variable store, copied from the
// package's template on its first boot: the firmware writes to it.
func ovmfVars(template, path string) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	b, err := os.ReadFile(template)
	if err != nil {
		return fmt.Errorf("UEFI variable store template (install the ovmf package): %w", err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("UEFI variable store: %w", err)
	}
	return nil
}
