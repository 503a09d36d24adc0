// Package libvirt is the provider that runs Tether machines as domains on a
// libvirtd: defined from a template (memory, vCPUs, network, firmware,
// boot), named "tether-<instance id>" and tagged with the instance id in
// their metadata, so that List and provider sync find every domain of
// Tether's and nothing else.
//
// libvirtd is the provider's memory: the domain's definition carries its
// instance id, its MAC and its UUID, and every state comes from
// DomainGetState, never from a stored value. The state directory holds
// only what QEMU reads and writes on this host: the serial console, for
// the moment of a boot the one-time token's file, and, when QEMU runs as
// another user, its copies of the kernel and initramfs.
package libvirt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/internal/keyed"
	"github.com/tetherfleet/tether/providers/internal/operr"
)

// Files in an instance directory.
const (
	consoleLogFile = "console.log"
	// tokenFile holds the one-time token from just before DomainCreate to
	// its return: QEMU reads fw_cfg files at start-up, and a token in the
	// definition would sit in libvirtd's files and in QEMU's argv.
	tokenFile = "fw_cfg-token"
)

// pollInterval is how often Stop asks whether an ACPI shutdown finished.
const pollInterval = 100 * time.Millisecond

// undefineFlags remove what libvirtd keeps beside a definition: the UEFI
// NVRAM, a managed save image, snapshot and checkpoint metadata.
const undefineFlags = golibvirt.DomainUndefineNvram | golibvirt.DomainUndefineManagedSave |
	golibvirt.DomainUndefineSnapshotsMetadata | golibvirt.DomainUndefineCheckpointsMetadata

// Provider is the libvirt provider. Machine ids are Tether instance ids.
type Provider struct {
	cfg    Config
	target target
	dial   dialFunc
	log    *slog.Logger
	locks  *keyed.Mutex
	owner  *[2]int // uid, gid; nil: leave files as they are

	mu      sync.Mutex
	domType string // resolved from DomainType on first use
}

var (
	_ providers.Provider  = (*Provider)(nil)
	_ providers.Netbooter = (*Provider)(nil)
)

// New validates cfg and returns the provider. It creates StateDir but does
// not connect: a control plane whose libvirtd is down still starts, and
// every operation then fails with a transient error naming the socket.
func New(cfg Config) (*Provider, error) { return newProvider(cfg, nil) }

// newProvider is New with the connection to libvirtd replaced (tests).
func newProvider(cfg Config, dial dialFunc) (*Provider, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	t, _ := parseURI(cfg.URI)
	if dial == nil {
		dial = rpcDialer(t)
	}
	p := &Provider{cfg: cfg, target: t, dial: dial, log: cfg.Logger, locks: keyed.New()}
	if cfg.DomainType != DomainTypeAuto {
		p.domType = cfg.DomainType
	}
	if cfg.FileOwner != "" {
		uid, gid, _ := lookupOwner(cfg.FileOwner)
		p.owner = &[2]int{uid, gid}
	}
	// QEMU (another user, under a system libvirtd) must be able to pass
	// through the state directory to its instance directories; what is
	// inside them is theirs alone.
	mode := os.FileMode(0o700)
	if p.owner != nil {
		mode = 0o711
	}
	if err := os.MkdirAll(cfg.StateDir, mode); err != nil {
		return nil, fmt.Errorf("libvirt: state dir: %w", err)
	}
	if err := os.Chmod(cfg.StateDir, mode); err != nil {
		return nil, fmt.Errorf("libvirt: state dir: %w", err)
	}
	if p.owner != nil {
		if dir := blockedParent(cfg.StateDir, p.owner[0]); dir != "" {
			cfg.Logger.Warn("libvirt: QEMU's user cannot pass through a parent of the state directory: direct boots will fail with Permission denied; give it o+x or use --libvirt-state-dir elsewhere",
				"dir", dir, "state_dir", cfg.StateDir, "file_owner", cfg.FileOwner)
		}
	}
	cfg.Logger.Info("libvirt provider", "uri", cfg.URI, "boot", cfg.Boot, "firmware", cfg.Firmware,
		"network", cfg.Network.String(), "domain_type", cfg.DomainType, "state_dir", cfg.StateDir)
	return p, nil
}

// blockedParent returns the first parent of dir that uid cannot search
// (no x for others, and not uid's own), or "".
func blockedParent(dir string, uid int) string {
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err == nil {
			st, ok := fi.Sys().(*syscall.Stat_t)
			mine := ok && int(st.Uid) == uid && fi.Mode().Perm()&0o100 != 0
			if !mine && fi.Mode().Perm()&0o001 == 0 {
				return d
			}
		}
		if d == filepath.Dir(d) {
			return ""
		}
	}
}

// Name implements providers.Provider.
func (p *Provider) Name() string { return Name }

// Netboots reports whether domains boot from their firmware over the
// network (--libvirt-boot network): providers.Netbooter.
func (p *Provider) Netboots() bool { return p.cfg.Boot.Netboot() }

// ConsoleLogPath returns the file the instance's serial console is written
// to; "" for an invalid id.
func (p *Provider) ConsoleLogPath(id string) string {
	if !validID.MatchString(id) {
		return ""
	}
	return filepath.Join(p.cfg.StateDir, id, consoleLogFile)
}

// Check connects to libvirtd once and resolves the domain type, so that
// tetherd can say at start-up that its libvirtd is unreachable.
func (p *Provider) Check(ctx context.Context) (domainType string, err error) {
	err = p.session(ctx, "check", "", func(h hypervisor) error {
		domainType, err = p.domainType(h)
		return err
	})
	return domainType, err
}

// session runs fn with one libvirtd connection, bounded by CallTimeout
// unless ctx ends sooner.
func (p *Provider) session(ctx context.Context, op, id string, fn func(h hypervisor) error) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.CallTimeout)
	defer cancel()
	h, err := p.dial(ctx)
	if err != nil {
		return errs.Transient(op, id, err)
	}
	err = fn(h)
	if cerr := h.Close(); cerr != nil {
		p.log.Warn("libvirt: closing the session", "op", op, "instance", id, "err", cerr)
	}
	return err
}

// domainType resolves auto to kvm when libvirtd's host offers it.
func (p *Provider) domainType(h hypervisor) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.domType != "" {
		return p.domType, nil
	}
	caps, err := h.Capabilities()
	if err != nil {
		return "", fmt.Errorf("libvirtd capabilities: %w", err)
	}
	kvm, err := offersKVM(caps)
	if err != nil {
		return "", err
	}
	p.domType = DomainTypeQEMU
	if kvm {
		p.domType = DomainTypeKVM
	}
	p.log.Info("libvirt domain type", "type", p.domType, "why", map[bool]string{true: "libvirtd offers kvm", false: "libvirtd offers no kvm: TCG"}[kvm])
	return p.domType, nil
}

func checkID(op, id string) error {
	if !validID.MatchString(id) {
		return errs.Permanent(op, id, fmt.Errorf("invalid instance id %q: want 1-64 of [A-Za-z0-9_.-], starting with a letter or digit", id))
	}
	return nil
}

// found is a domain looked up by instance id.
type found struct {
	dom    golibvirt.Domain
	exists bool
	state  golibvirt.DomainState
	reason int32
}

func (f found) active() bool {
	switch f.state {
	case golibvirt.DomainShutoff, golibvirt.DomainCrashed, golibvirt.DomainNostate:
		return false
	}
	return true
}

// lookup finds the instance's domain and its state, and refuses a domain
// that has the name but not the tag: it is not Tether's to touch.
func (p *Provider) lookup(h hypervisor, op, id string) (found, error) {
	d, err := h.LookupByName(DomainName(id))
	if isCode(err, golibvirt.ErrNoDomain) {
		return found{}, nil
	}
	if err != nil {
		return found{}, wrap(op, id, "look up domain "+DomainName(id), err)
	}
	md, err := h.Metadata(d, MetadataNS)
	if isCode(err, golibvirt.ErrNoDomain) {
		return found{}, nil
	}
	if err != nil && !isCode(err, golibvirt.ErrNoDomainMetadata) {
		return found{}, wrap(op, id, "domain metadata", err)
	}
	got, perr := instanceOf(md)
	if err != nil || perr != nil || got != id {
		return found{}, errs.Permanent(op, id, fmt.Errorf("domain %s exists but is not tagged as instance %s in its metadata (%s): it is not Tether's; rename or remove it", DomainName(id), id, MetadataNS))
	}
	st, reason, err := h.State(d)
	if isCode(err, golibvirt.ErrNoDomain) {
		return found{}, nil
	}
	if err != nil {
		return found{}, wrap(op, id, "domain state", err)
	}
	return found{dom: d, exists: true, state: st, reason: reason}, nil
}

func (p *Provider) Provision(ctx context.Context, spec providers.Spec) (providers.Machine, error) {
	id := spec.InstanceID
	if err := checkID(operr.Provision, id); err != nil {
		return providers.Machine{}, err
	}
	if err := p.checkBoot(operr.Provision, id, spec.Boot); err != nil {
		return providers.Machine{}, err
	}
	if p.cfg.Boot.Netboot() {
		if err := checkMAC(operr.Provision, id, spec.MAC); err != nil {
			return providers.Machine{}, err
		}
	}
	unlock, err := p.locks.Lock(ctx, id)
	if err != nil {
		return providers.Machine{}, errs.Transient(operr.Provision, id, err)
	}
	defer unlock()
	var m providers.Machine
	err = p.session(ctx, operr.Provision, id, func(h hypervisor) error {
		f, err := p.lookup(h, operr.Provision, id)
		if err != nil {
			return err
		}
		if f.exists && !(f.state == golibvirt.DomainShutoff && f.reason == int32(golibvirt.DomainShutoffUnknown)) {
			// Provision is idempotent by instance id: the domain exists
			// and has run, so it is returned in whatever state it is in.
			m = p.machine(id, f)
			return nil
		}
		// A fresh instance, or a definition an earlier attempt left
		// without booting it (shut off, for no reason libvirtd knows).
		m, err = p.boot(h, operr.Provision, id, spec.Boot, spec.MAC, f)
		if err != nil && !f.exists {
			p.discard(h, id)
		}
		return err
	})
	return m, err
}

// discard removes what a failed first boot created: the machine then reads
// gone, which is what it is.
func (p *Provider) discard(h hypervisor, id string) {
	if d, err := h.LookupByName(DomainName(id)); err == nil {
		_ = h.Destroy(d)
		if err := h.Undefine(d, undefineFlags); err != nil && !isCode(err, golibvirt.ErrNoDomain) {
			p.log.Warn("libvirt provision: undefine after a failed boot", "instance", id, "err", err)
		}
	}
	if err := os.RemoveAll(filepath.Join(p.cfg.StateDir, id)); err != nil {
		p.log.Warn("libvirt provision: cleaning up after a failed boot", "instance", id, "err", err)
	}
}

func (p *Provider) Start(ctx context.Context, id string, boot providers.Boot) (providers.Machine, error) {
	return p.power(ctx, operr.Start, id, boot)
}

func (p *Provider) Reboot(ctx context.Context, id string, boot providers.Boot) (providers.Machine, error) {
	return p.power(ctx, operr.Reboot, id, boot)
}

// power implements Start and Reboot. Both boot a new QEMU process: a fresh
// boot needs a fresh one-time token in fw_cfg, and a guest reset would
// replay the spent one. Start leaves a running domain alone; Reboot
// destroys it first. Rebooting a stopped domain boots it: the caller asked
// for a fresh boot.
func (p *Provider) power(ctx context.Context, op, id string, boot providers.Boot) (providers.Machine, error) {
	if err := checkID(op, id); err != nil {
		return providers.Machine{}, err
	}
	if err := p.checkBoot(op, id, boot); err != nil {
		return providers.Machine{}, err
	}
	unlock, err := p.locks.Lock(ctx, id)
	if err != nil {
		return providers.Machine{}, errs.Transient(op, id, err)
	}
	defer unlock()
	var m providers.Machine
	err = p.session(ctx, op, id, func(h hypervisor) error {
		f, err := p.lookup(h, op, id)
		if err != nil {
			return err
		}
		if !f.exists {
			return notFound(op, id)
		}
		if f.active() {
			if op == operr.Start {
				m = p.machine(id, f)
				return nil
			}
			if err := h.Destroy(f.dom); err != nil && !isCode(err, golibvirt.ErrOperationInvalid) {
				return wrap(op, id, "destroy before the new boot", err)
			}
		}
		m, err = p.boot(h, op, id, boot, "", f)
		return err
	})
	return m, err
}

// boot (re)defines the instance's domain for this boot and starts it.
// mac is the NIC's address for a new domain; an existing one keeps its own.
// Callers hold the instance lock.
func (p *Provider) boot(h hypervisor, op, id string, boot providers.Boot, mac string, f found) (providers.Machine, error) {
	typ, err := p.domainType(h)
	if err != nil {
		return providers.Machine{}, wrap(op, id, "domain type", err)
	}
	s := domainSpec{
		Name: DomainName(id), InstanceID: id, Type: typ, Machine: p.cfg.MachineType,
		MemoryMiB: p.cfg.MemoryMiB, CPUs: p.cfg.CPUs, Boot: p.cfg.Boot, Firmware: p.cfg.Firmware,
		OVMFCode: p.cfg.OVMFCode, OVMFVars: p.cfg.OVMFVars, Network: p.cfg.Network, MAC: mac,
		Console: p.ConsoleLogPath(id), TPM: p.cfg.TPM, SecureBoot: p.cfg.SecureBoot,
	}
	if f.exists {
		// Keep the domain's identity across definitions: libvirtd refuses
		// a new UUID for a name it knows, and the MAC is the node's.
		s.UUID, s.MAC, err = identity(h, f.dom)
		if err != nil {
			return providers.Machine{}, wrap(op, id, "the domain's definition", err)
		}
	}
	if s.Boot.Netboot() {
		if s.MAC == "" {
			return providers.Machine{}, errs.Permanent(op, id, errors.New("a netbooting domain needs a hardware address (the node's MAC), and its definition has none"))
		}
		if s.Network.Kind == "user" {
			if s.BootFile, err = bootFileURL(boot, s.MAC); err != nil {
				return providers.Machine{}, errs.Permanent(op, id, err)
			}
			if s.Boot == BootUEFIHTTP {
				// The firmware loads the image itself: no script between.
				s.BootFile = strings.TrimSuffix(s.BootFile, providers.BootScriptPath(s.MAC)) + providers.UKIBootPath(s.MAC)
			}
		}
	} else {
		s.Kernel, s.Initramfs, s.KernelArgs = boot.KernelPath, boot.InitramfsPath, boot.KernelArgs
		s.URL, s.CA, s.Signers = boot.Enrollment.ControlPlaneURL, boot.Enrollment.CAFingerprint, boot.Signers
		s.Instance = boot.Enrollment.InstanceID
	}

	dir := filepath.Join(p.cfg.StateDir, id)
	if err := p.ownedDir(dir); err != nil {
		return providers.Machine{}, errs.Transient(op, id, err)
	}
	if s.Boot == BootDirect && p.owner != nil {
		// QEMU runs as another user, who cannot read the control plane's
		// files (its blob store is private): it gets its own copies.
		if s.Kernel, err = p.stage(dir, "kernel", s.Kernel); err != nil {
			return providers.Machine{}, errs.Transient(op, id, err)
		}
		if s.Initramfs, err = p.stage(dir, "initramfs", s.Initramfs); err != nil {
			return providers.Machine{}, errs.Transient(op, id, err)
		}
	}
	if s.Boot == BootDirect && boot.Enrollment.Token != "" {
		s.TokenFile = filepath.Join(dir, tokenFile)
		// The file exists only until DomainCreate returns: by then QEMU
		// has read it (or will never run with it).
		defer removeQuietly(s.TokenFile)
		if err := p.writeSecret(s.TokenFile, boot.Enrollment.Token); err != nil {
			return providers.Machine{}, errs.Transient(op, id, fmt.Errorf("write token file: %w", err))
		}
	}
	doc, err := domainXML(s)
	if err != nil {
		return providers.Machine{}, errs.Permanent(op, id, err)
	}
	d, err := h.DefineXML(doc)
	if err != nil {
		return providers.Machine{}, wrap(op, id, "define domain", err)
	}
	if err := h.Create(d); err != nil {
		return providers.Machine{}, p.createErr(op, id, err)
	}
	st, reason, err := h.State(d)
	if err != nil {
		return providers.Machine{}, wrap(op, id, "domain state after start", err)
	}
	m := p.machine(id, found{dom: d, exists: true, state: st, reason: reason})
	p.log.Info("libvirt domain booted", "instance", id, "op", op, "domain", d.Name, "state", m.State, "type", typ)
	return m, nil
}

// createErr explains the start failures an operator can fix.
func (p *Provider) createErr(op, id string, err error) error {
	msg := err.Error()
	if strings.Contains(msg, "Permission denied") && p.owner == nil {
		err = fmt.Errorf("%w (QEMU runs as another user than the control plane: set --libvirt-file-owner to it, e.g. libvirt-qemu)", err)
	}
	return wrap(op, id, "start domain", err)
}

// identity reads the UUID and the NIC's MAC from a domain's definition.
func identity(h hypervisor, d golibvirt.Domain) (uuid, mac string, err error) {
	x, err := h.XMLDesc(d)
	if err != nil {
		return "", "", err
	}
	var dom libvirtxml.Domain
	if err := dom.Unmarshal(x); err != nil {
		return "", "", fmt.Errorf("parse the domain's XML: %w", err)
	}
	if dom.Devices != nil && len(dom.Devices.Interfaces) > 0 && dom.Devices.Interfaces[0].MAC != nil {
		mac = dom.Devices.Interfaces[0].MAC.Address
	}
	if dom.QEMUCommandline != nil {
		for _, a := range dom.QEMUCommandline.Args {
			if v, ok := strings.CutPrefix(a.Value, "virtio-net-pci,netdev="+netbootNetdev+",mac="); ok {
				mac, _, _ = strings.Cut(v, ",")
			}
		}
	}
	return dom.UUID, mac, nil
}

func (p *Provider) Stop(ctx context.Context, id string) (providers.Machine, error) {
	if err := checkID(operr.Stop, id); err != nil {
		return providers.Machine{}, err
	}
	unlock, err := p.locks.Lock(ctx, id)
	if err != nil {
		return providers.Machine{}, errs.Transient(operr.Stop, id, err)
	}
	defer unlock()
	var m providers.Machine
	err = p.session(ctx, operr.Stop, id, func(h hypervisor) error {
		f, err := p.lookup(h, operr.Stop, id)
		if err != nil {
			return err
		}
		if !f.exists {
			return notFound(operr.Stop, id)
		}
		if f.active() {
			if err := p.halt(ctx, h, id, f.dom); err != nil {
				return err
			}
		}
		m = providers.Machine{ID: id, InstanceID: id, State: providers.StateStopped, Detail: "domain " + DomainName(id) + " shut off"}
		return nil
	})
	return m, err
}

// halt presses the ACPI power button, waits up to StopGrace for the guest
// to power off, then destroys the domain.
func (p *Provider) halt(ctx context.Context, h hypervisor, id string, d golibvirt.Domain) error {
	if err := h.Shutdown(d); err != nil {
		// A guest that cannot take the button (a paused one, one without
		// ACPI) still gets destroyed; one that stopped meanwhile makes
		// the destroy a no-op.
		p.log.Info("libvirt stop: ACPI shutdown refused; destroying", "instance", id, "err", err)
	} else if off, err := p.awaitOff(ctx, h, d); err != nil {
		return err
	} else if off {
		p.log.Info("libvirt stopped (ACPI)", "instance", id)
		return nil
	}
	if err := h.Destroy(d); err != nil && !isCode(err, golibvirt.ErrOperationInvalid) {
		return wrap(operr.Stop, id, "destroy after the ACPI grace", err)
	}
	p.log.Info("libvirt stopped (destroyed after the ACPI grace)", "instance", id, "grace", p.cfg.StopGrace)
	return nil
}

// awaitOff polls the domain's state until it is off or StopGrace passes.
// Polling, because libvirt's lifecycle events need a long-lived
// connection this one-session-per-operation provider does not keep.
func (p *Provider) awaitOff(ctx context.Context, h hypervisor, d golibvirt.Domain) (bool, error) {
	grace := p.cfg.Clock.NewTimer(p.cfg.StopGrace)
	defer grace.Stop()
	tick := p.cfg.Clock.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		st, _, err := h.State(d)
		if isCode(err, golibvirt.ErrNoDomain) {
			return true, nil
		}
		if err != nil {
			return false, wrap(operr.Stop, d.Name, "domain state", err)
		}
		if f := (found{state: st}); !f.active() {
			return true, nil
		}
		select {
		case <-ctx.Done():
			return false, errs.Transient(operr.Stop, d.Name, ctx.Err())
		case <-grace.C():
			return false, nil
		case <-tick.C():
		}
	}
}

func (p *Provider) Terminate(ctx context.Context, id string) error {
	if err := checkID(operr.Terminate, id); err != nil {
		return err
	}
	unlock, err := p.locks.Lock(ctx, id)
	if err != nil {
		return errs.Transient(operr.Terminate, id, err)
	}
	defer unlock()
	return p.session(ctx, operr.Terminate, id, func(h hypervisor) error {
		f, err := p.lookup(h, operr.Terminate, id)
		if err != nil {
			return err
		}
		if f.exists {
			if f.active() {
				if err := h.Destroy(f.dom); err != nil && !isCode(err, golibvirt.ErrOperationInvalid) && !isCode(err, golibvirt.ErrNoDomain) {
					return wrap(operr.Terminate, id, "destroy", err)
				}
			}
			if err := h.Undefine(f.dom, undefineFlags); err != nil && !isCode(err, golibvirt.ErrNoDomain) {
				return wrap(operr.Terminate, id, "undefine (with its NVRAM)", err)
			}
		}
		// The directory goes last: while the domain exists, its console
		// is what an operator reads to learn why a terminate failed.
		if err := os.RemoveAll(filepath.Join(p.cfg.StateDir, id)); err != nil {
			return errs.Transient(operr.Terminate, id, fmt.Errorf("remove instance dir: %w", err))
		}
		if f.exists {
			p.log.Info("libvirt terminated", "instance", id, "domain", DomainName(id))
		}
		return nil
	})
}

func (p *Provider) Status(ctx context.Context, id string) (providers.Machine, error) {
	if err := checkID(operr.Status, id); err != nil {
		return providers.Machine{}, err
	}
	var m providers.Machine
	err := p.session(ctx, operr.Status, id, func(h hypervisor) error {
		f, err := p.lookup(h, operr.Status, id)
		if err != nil {
			return err
		}
		m = p.machine(id, f)
		return nil
	})
	return m, err
}

func (p *Provider) List(ctx context.Context) ([]providers.Machine, error) {
	var out []providers.Machine
	err := p.session(ctx, operr.List, "", func(h hypervisor) error {
		ds, err := h.ListAll()
		if err != nil {
			return wrap(operr.List, "", "list domains", err)
		}
		for _, d := range ds {
			md, err := h.Metadata(d, MetadataNS)
			if isCode(err, golibvirt.ErrNoDomainMetadata) || isCode(err, golibvirt.ErrNoDomain) {
				continue // not Tether's, or gone since the list
			}
			if err != nil {
				if ctx.Err() != nil {
					return errs.Transient(operr.List, "", ctx.Err())
				}
				return wrap(operr.List, "", "metadata of domain "+d.Name, err)
			}
			id, err := instanceOf(md)
			if err != nil {
				p.log.Warn("libvirt list: a domain carries Tether's metadata with no valid instance id", "domain", d.Name, "err", err)
				continue
			}
			st, reason, err := h.State(d)
			if isCode(err, golibvirt.ErrNoDomain) {
				continue
			}
			if err != nil {
				if ctx.Err() != nil {
					return errs.Transient(operr.List, "", ctx.Err())
				}
				// One domain whose state cannot be read must not hide the
				// others; unknown is what the sync loop leaves alone.
				out = append(out, providers.Machine{ID: id, InstanceID: id, State: providers.StateUnknown, Detail: err.Error()})
				continue
			}
			out = append(out, p.machine(id, found{dom: d, exists: true, state: st, reason: reason}))
		}
		return nil
	})
	return out, err
}

func (p *Provider) machine(id string, f found) providers.Machine {
	if !f.exists {
		return providers.Machine{ID: id, InstanceID: id, State: providers.StateGone}
	}
	return providers.Machine{ID: id, InstanceID: id, State: machineState(f.state),
		Detail: fmt.Sprintf("domain %s, %s", f.dom.Name, stateText(f.state, f.reason))}
}

// machineState maps libvirt's domain state to the provider's vocabulary.
// A guest being shut down is still running until it is off.
func machineState(st golibvirt.DomainState) providers.MachineState {
	switch st {
	case golibvirt.DomainRunning, golibvirt.DomainBlocked, golibvirt.DomainShutdown:
		return providers.StateRunning
	case golibvirt.DomainPaused, golibvirt.DomainPmsuspended:
		return providers.StatePaused
	case golibvirt.DomainShutoff, golibvirt.DomainCrashed:
		return providers.StateStopped
	}
	return providers.StateUnknown
}

func stateText(st golibvirt.DomainState, reason int32) string {
	names := map[golibvirt.DomainState]string{
		golibvirt.DomainNostate: "no state", golibvirt.DomainRunning: "running", golibvirt.DomainBlocked: "blocked",
		golibvirt.DomainPaused: "paused", golibvirt.DomainShutdown: "shutting down", golibvirt.DomainShutoff: "shut off",
		golibvirt.DomainCrashed: "crashed", golibvirt.DomainPmsuspended: "suspended",
	}
	name, ok := names[st]
	if !ok {
		name = fmt.Sprintf("state %d", st)
	}
	return fmt.Sprintf("libvirt state %s (reason %d)", name, reason)
}

// checkBoot refuses a boot that cannot work, before anything is created.
func (p *Provider) checkBoot(op, id string, b providers.Boot) error {
	if p.cfg.Boot.Netboot() {
		if p.cfg.Network.Kind == "user" {
			if _, err := bootFileURL(b, "00:00:00:00:00:00"); err != nil {
				return errs.Permanent(op, id, err)
			}
		}
		return nil
	}
	if b.KernelPath == "" || b.InitramfsPath == "" {
		return errs.Permanent(op, id, errors.New("boot needs a kernel path and an initramfs path (direct kernel boot)"))
	}
	for _, f := range []struct{ what, path string }{{"kernel", b.KernelPath}, {"initramfs", b.InitramfsPath}} {
		if _, err := os.Stat(f.path); err != nil {
			return errs.Permanent(op, id, fmt.Errorf("%s: %w", f.what, err))
		}
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

// ownedDir makes an instance directory that QEMU may write its console to.
func (p *Provider) ownedDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("instance dir: %w", err)
	}
	if p.owner != nil {
		if err := os.Chown(dir, p.owner[0], p.owner[1]); err != nil {
			return fmt.Errorf("instance dir: give it to the QEMU user: %w", err)
		}
	}
	return nil
}

// stage copies src into the instance directory as NAME-<base of src>,
// owned by FileOwner, unless a copy of the same size is there already (the
// control plane's artifacts are content-addressed: their base name is their
// digest). Copies of other artifacts under NAME are removed.
func (p *Provider) stage(dir, name, src string) (string, error) {
	dst := filepath.Join(dir, name+"-"+filepath.Base(src))
	si, err := os.Stat(src)
	if err != nil {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	if old, _ := filepath.Glob(filepath.Join(dir, name+"-*")); len(old) > 0 {
		for _, o := range old {
			if o == dst {
				continue
			}
			removeQuietly(o)
		}
	}
	if di, err := os.Stat(dst); err == nil && di.Size() == si.Size() {
		return dst, nil
	}
	in, err := os.Open(src)
	if err != nil {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	defer in.Close()
	tmp, err := os.CreateTemp(dir, ".stage-*")
	if err != nil {
		return "", fmt.Errorf("stage the %s for QEMU: %w", name, err)
	}
	_, cerr := io.Copy(tmp, in)
	oerr := tmp.Chown(p.owner[0], p.owner[1])
	if err := errors.Join(cerr, oerr, tmp.Close()); err != nil {
		removeQuietly(tmp.Name())
		return "", fmt.Errorf("stage the %s for QEMU: %w", name, err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		removeQuietly(tmp.Name())
		return "", fmt.Errorf("stage the %s for QEMU: %w", name, err)
	}
	return dst, nil
}

// writeSecret writes a new 0600 file for QEMU to read; it refuses to follow
// a planted symlink or reuse a file someone else created.
func (p *Provider) writeSecret(path, content string) error {
	removeQuietly(path)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, werr := f.WriteString(content)
	var oerr error
	if p.owner != nil {
		oerr = f.Chown(p.owner[0], p.owner[1])
	}
	return errors.Join(werr, oerr, f.Close())
}

func removeQuietly(path string) { _ = os.Remove(path) }
