package qemu

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/internal/operr"
)

// Entry is one thing recorder mode would have done.
type Entry struct {
	At         time.Time
	Op         string
	InstanceID string
	// Argv is the QEMU command line a launch would run, secrets redacted
	// (the token never is on it; it travels in a 0600 file).
	Argv []string
	// QMP lists the QMP commands, in order.
	QMP []string
	// Steps names the other side effects, in order (files written and
	// removed, waits, signals).
	Steps []string
	// Result is the machine state after the operation.
	Result providers.MachineState
}

// recorder is the in-memory stand-in for real mode: same validation and same
// command lines, no processes.
type recorder struct {
	cfg   Config
	accel string

	mu       sync.Mutex
	machines map[string]providers.MachineState
	macs     map[string]string // netboot: each VM's hardware address
	nodes    map[string]string // --qemu-tpm: each VM's node
	entries  []Entry
}

func newRecorder(cfg Config, accel string) *recorder {
	return &recorder{cfg: cfg, accel: accel, machines: map[string]providers.MachineState{}, macs: map[string]string{}, nodes: map[string]string{}}
}

func (r *recorder) record(e Entry) {
	e.At = r.cfg.Clock.Now()
	r.entries = append(r.entries, e)
	if over := len(r.entries) - r.cfg.RecorderLimit; over > 0 {
		r.entries = slices.Delete(r.entries, 0, over)
	}
}

func (r *recorder) entriesCopy() []Entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Entry, len(r.entries))
	for i, e := range r.entries {
		e.Argv = slices.Clone(e.Argv)
		e.QMP = slices.Clone(e.QMP)
		e.Steps = slices.Clone(e.Steps)
		out[i] = e
	}
	return out
}

func (r *recorder) launchEntry(op, id string, boot providers.Boot) (Entry, error) {
	p := pathsFor(r.cfg.StateDir, id)
	if r.cfg.Boot.Netboot() {
		boot.Enrollment.Token = ""
	}
	withToken := boot.Enrollment.Token != ""
	ls := launchSpec{
		Binary:     r.cfg.Binary,
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
	if err := netbootLaunch(r.cfg, &ls, boot, r.macs[id]); err != nil {
		return Entry{}, errs.Permanent(op, id, err)
	}
	ls.TPM = r.cfg.TPM
	argv := buildArgv(ls)
	var steps []string
	if op == operr.Provision {
		steps = append(steps, "mkdir "+p.dir+" 0700")
	}
	if r.cfg.TPM {
		dir := filepath.Join(p.dir, tpmDirName)
		if n := r.nodes[id]; n != "" {
			dir = TPMDir(r.cfg.StateDir, n)
		}
		steps = append(steps, "swtpm_setup "+dir+" unless made (once per node)",
			"start "+strings.Join(swtpmArgv(swtpmBinary, filepath.Join(dir, tpmStateSubdir), p), " ")+" with "+p.tpmSock+" as fd 3")
	}
	if withToken {
		steps = append(steps, "write "+p.token+" 0600 (token redacted)")
	}
	steps = append(steps, "start qemu in its own session", "write "+p.pid, "wait for QMP query-status")
	if withToken {
		steps = append(steps, "remove "+p.token)
	}
	return Entry{Op: op, InstanceID: id, Argv: redact(argv, boot.Enrollment.Token), QMP: []string{"query-status"}, Steps: steps, Result: providers.StateRunning}, nil
}

func (r *recorder) Provision(_ context.Context, spec providers.Spec) (providers.Machine, error) {
	id := spec.InstanceID
	if err := checkID(operr.Provision, id); err != nil {
		return providers.Machine{}, err
	}
	if err := checkBoot(r.cfg, operr.Provision, id, spec.Boot); err != nil {
		return providers.Machine{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if st, ok := r.machines[id]; ok {
		return r.machine(id, st), nil
	}
	if r.cfg.Boot.Netboot() {
		if err := checkMAC(operr.Provision, id, spec.MAC); err != nil {
			return providers.Machine{}, err
		}
		r.macs[id] = spec.MAC
	}
	if r.cfg.TPM && spec.Node != "" {
		if !validID.MatchString(spec.Node) {
			delete(r.macs, id)
			return providers.Machine{}, errs.Permanent(operr.Provision, id, fmt.Errorf("node %q cannot name a TPM directory", spec.Node))
		}
		r.nodes[id] = spec.Node
	}
	e, err := r.launchEntry(operr.Provision, id, spec.Boot)
	if err != nil {
		delete(r.macs, id)
		delete(r.nodes, id)
		return providers.Machine{}, err
	}
	r.record(e)
	r.machines[id] = providers.StateRunning
	return r.machine(id, providers.StateRunning), nil
}

func (r *recorder) Start(_ context.Context, id string, boot providers.Boot) (providers.Machine, error) {
	return r.boot(operr.Start, id, boot)
}

func (r *recorder) Reboot(_ context.Context, id string, boot providers.Boot) (providers.Machine, error) {
	return r.boot(operr.Reboot, id, boot)
}

func (r *recorder) boot(op, id string, boot providers.Boot) (providers.Machine, error) {
	if err := checkID(op, id); err != nil {
		return providers.Machine{}, err
	}
	if err := checkBoot(r.cfg, op, id, boot); err != nil {
		return providers.Machine{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	st, ok := r.machines[id]
	if !ok {
		return providers.Machine{}, notFound(op, id)
	}
	if st == providers.StateRunning && op == operr.Start {
		return r.machine(id, st), nil
	}
	e, err := r.launchEntry(op, id, boot)
	if err != nil {
		return providers.Machine{}, err
	}
	if st == providers.StateRunning {
		e.QMP = append([]string{"system_powerdown", "quit"}, e.QMP...)
		e.Steps = append([]string{"wait " + r.cfg.StopGrace.String() + " for ACPI powerdown", "quit", "wait for exit, SIGKILL after " + r.cfg.KillTimeout.String()}, e.Steps...)
	}
	r.record(e)
	r.machines[id] = providers.StateRunning
	return r.machine(id, providers.StateRunning), nil
}

func (r *recorder) Stop(_ context.Context, id string) (providers.Machine, error) {
	if err := checkID(operr.Stop, id); err != nil {
		return providers.Machine{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	st, ok := r.machines[id]
	if !ok {
		return providers.Machine{}, notFound(operr.Stop, id)
	}
	if st != providers.StateStopped {
		r.record(Entry{
			Op: operr.Stop, InstanceID: id,
			QMP:    []string{"system_powerdown", "quit"},
			Steps:  []string{"wait " + r.cfg.StopGrace.String() + " for ACPI powerdown", "quit", "SIGKILL if alive after " + r.cfg.KillTimeout.String(), "keep " + pathsFor(r.cfg.StateDir, id).dir},
			Result: providers.StateStopped,
		})
		r.machines[id] = providers.StateStopped
	}
	return r.machine(id, providers.StateStopped), nil
}

func (r *recorder) Terminate(_ context.Context, id string) error {
	if err := checkID(operr.Terminate, id); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	st, ok := r.machines[id]
	if !ok {
		return nil
	}
	e := Entry{Op: operr.Terminate, InstanceID: id, Result: providers.StateGone}
	if st != providers.StateStopped {
		e.QMP = []string{"quit"}
		e.Steps = []string{"SIGKILL if alive after " + r.cfg.KillTimeout.String()}
	}
	if r.cfg.TPM {
		e.Steps = append(e.Steps, "stop swtpm (SIGTERM, SIGKILL after "+r.cfg.KillTimeout.String()+")")
		if n := r.nodes[id]; n != "" {
			e.Steps = append(e.Steps, "keep "+TPMDir(r.cfg.StateDir, n))
		}
	}
	e.Steps = append(e.Steps, "remove "+pathsFor(r.cfg.StateDir, id).dir)
	r.record(e)
	delete(r.machines, id)
	delete(r.macs, id)
	delete(r.nodes, id)
	return nil
}

func (r *recorder) Status(_ context.Context, id string) (providers.Machine, error) {
	if err := checkID(operr.Status, id); err != nil {
		return providers.Machine{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	st, ok := r.machines[id]
	if !ok {
		st = providers.StateGone
	}
	return r.machine(id, st), nil
}

func (r *recorder) List(context.Context) ([]providers.Machine, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []providers.Machine
	for _, id := range slices.Sorted(maps.Keys(r.machines)) {
		out = append(out, r.machine(id, r.machines[id]))
	}
	return out, nil
}

func (r *recorder) machine(id string, st providers.MachineState) providers.Machine {
	return providers.Machine{ID: id, InstanceID: id, State: st, Detail: "recorder mode: no VM"}
}
