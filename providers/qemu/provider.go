// Package qemu is the provider that boots Tether machines as local QEMU VMs:
// direct kernel boot of the template's kernel and initramfs, enrollment data
// in fw_cfg, user-mode networking, and a QMP socket for control.
//
// Real mode keeps its state in a directory per instance (pid file, QMP
// socket, console log), so VMs outlive a control plane restart and are found
// again by the next one. Status always asks the process table and QMP, never
// a stored value. Recorder mode does the same bookkeeping in memory and
// records the command lines it would run; disabled mode refuses everything.
package qemu

import (
	"context"
	"errors"
	"fmt"

	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/internal/operr"
)

// driver is one mode's implementation of the provider operations.
type driver interface {
	Provision(ctx context.Context, spec providers.Spec) (providers.Machine, error)
	Start(ctx context.Context, id string, boot providers.Boot) (providers.Machine, error)
	Stop(ctx context.Context, id string) (providers.Machine, error)
	Reboot(ctx context.Context, id string, boot providers.Boot) (providers.Machine, error)
	Terminate(ctx context.Context, id string) error
	Status(ctx context.Context, id string) (providers.Machine, error)
	List(ctx context.Context) ([]providers.Machine, error)
}

// Provider is the qemu provider. Machine ids are Tether instance ids.
type Provider struct {
	cfg   Config
	accel string
	driver
	rec *recorder
}

var _ providers.Provider = (*Provider)(nil)

// New validates cfg and returns a provider in cfg.Mode. In real mode it
// creates StateDir; it does not look for the QEMU binary, so that a host
// without QEMU can still run tetherd (every launch then fails with a
// permanent error that says what to install).
func New(cfg Config) (*Provider, error) { return newProvider(cfg, kvmUsable) }

func newProvider(cfg Config, probe kvmProbe) (*Provider, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	p := &Provider{cfg: cfg}
	if cfg.Mode == ModeDisabled {
		p.driver = disabled{}
		return p, nil
	}
	accel, why := resolveAccel(cfg.Accel, probe)
	p.accel = accel
	cfg.Logger.Info("qemu provider", "mode", cfg.Mode, "accel", accel, "why", why, "state_dir", cfg.StateDir)
	switch cfg.Mode {
	case ModeRecorder:
		p.rec = newRecorder(cfg, accel)
		p.driver = p.rec
	case ModeReal:
		if cfg.TPM {
			// Refuse now, not at the first boot: an operator who asked
			// for TPMs must not get a control plane whose every VM fails.
			if err := checkTPMTools(); err != nil {
				return nil, err
			}
		}
		d, err := newRealDriver(cfg, accel)
		if err != nil {
			return nil, err
		}
		p.driver = d
	}
	return p, nil
}

// Name implements providers.Provider.
func (p *Provider) Name() string { return Name }

// Mode returns the provider's mode.
func (p *Provider) Mode() Mode { return p.cfg.Mode }

// Accel returns the accelerator VMs get (kvm or tcg); "" when disabled.
func (p *Provider) Accel() string { return p.accel }

// ConsoleLogPath returns the file the instance's serial console is written
// to (it survives restarts of the VM, not its termination). It is "" for an
// invalid id and in disabled mode; in recorder mode the file never exists.
func (p *Provider) ConsoleLogPath(id string) string {
	if p.cfg.Mode == ModeDisabled {
		return ""
	}
	return consolePath(p.cfg.StateDir, id)
}

// TPM reports whether VMs get a TPM (--qemu-tpm).
func (p *Provider) TPM() bool { return p.cfg.Mode != ModeDisabled && p.cfg.TPM }

// NodeTPMDir is the directory of a node's TPM; "" for a name that is not
// a safe path element, or when the provider is disabled.
func (p *Provider) NodeTPMDir(node string) string {
	if p.cfg.Mode == ModeDisabled || !validID.MatchString(node) {
		return ""
	}
	return TPMDir(p.cfg.StateDir, node)
}

// PrepareNodeTPM makes the node's TPM now, before any instance of it boots,
// and returns its EK hash, so an operator can register the node's EK
// (tetherctl node update --ek) ahead of its first boot. An existing TPM is
// kept.
func (p *Provider) PrepareNodeTPM(node string) (string, error) {
	dir := p.NodeTPMDir(node)
	if dir == "" {
		return "", fmt.Errorf("qemu: no TPM for node %q (provider disabled, or not a name of [A-Za-z0-9_.-])", node)
	}
	return PrepareTPM(dir)
}

// TPMEKHash is the EK hash ("sha256:HEX") of the TPM a machine boots with
// (its node's), for the instance view; "" when the provider gives no TPMs,
// in recorder mode, and before the TPM is made.
func (p *Provider) TPMEKHash(id string) string {
	if d, ok := p.driver.(*realDriver); ok {
		return d.ekHash(id)
	}
	return ""
}

// Netboots reports whether VMs boot from their firmware over the network
// (--qemu-boot bios or uefi): providers.Netbooter.
func (p *Provider) Netboots() bool { return p.cfg.Mode != ModeDisabled && p.cfg.Boot.Netboot() }

var _ providers.Netbooter = (*Provider)(nil)

// Recorded returns what recorder mode would have done, oldest first; nil in
// the other modes.
func (p *Provider) Recorded() []Entry {
	if p.rec == nil {
		return nil
	}
	return p.rec.entriesCopy()
}

// disabled refuses every operation, so an instance aimed at a disabled
// provider fails loudly instead of waiting for a machine that never comes.
type disabled struct{}

var errDisabled = errors.New("qemu provider disabled")

func refuse(op string) error {
	return errs.Err(providers.KindUnsupported, op, "", errDisabled)
}

func (disabled) Provision(context.Context, providers.Spec) (providers.Machine, error) {
	return providers.Machine{}, refuse(operr.Provision)
}

func (disabled) Start(context.Context, string, providers.Boot) (providers.Machine, error) {
	return providers.Machine{}, refuse(operr.Start)
}

func (disabled) Stop(context.Context, string) (providers.Machine, error) {
	return providers.Machine{}, refuse(operr.Stop)
}

func (disabled) Reboot(context.Context, string, providers.Boot) (providers.Machine, error) {
	return providers.Machine{}, refuse(operr.Reboot)
}

func (disabled) Terminate(context.Context, string) error { return refuse(operr.Terminate) }

func (disabled) Status(context.Context, string) (providers.Machine, error) {
	return providers.Machine{}, refuse(operr.Status)
}

func (disabled) List(context.Context) ([]providers.Machine, error) { return nil, refuse(operr.List) }

// WatchExits implements providers.ExitWatcher: in real mode every QEMU
// child tetherd reaps is reported; the other modes have no processes.
func (p *Provider) WatchExits(ctx context.Context, f func(providers.Exit)) {
	if w, ok := p.driver.(providers.ExitWatcher); ok {
		w.WatchExits(ctx, f)
	}
}

var _ providers.ExitWatcher = (*Provider)(nil)

// Exited implements providers.ExitReporter: in real mode, a QEMU that
// exited since it was last launched (a child reaped, or the pidfd of a VM
// an earlier tetherd started). The other modes have no processes.
func (p *Provider) Exited(id string) (string, bool) {
	if r, ok := p.driver.(providers.ExitReporter); ok {
		return r.Exited(id)
	}
	return "", false
}

var _ providers.ExitReporter = (*Provider)(nil)
