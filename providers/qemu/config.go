package qemu

import (
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/tetherfleet/tether/internal/clock"
)

// Name is the provider's registered name.
const Name = "qemu"

// Mode selects what the provider does with a request.
type Mode string

const (
	// ModeReal boots real QEMU VMs.
	ModeReal Mode = "real"
	// ModeRecorder records what real mode would do (argv, QMP commands) and
	// keeps machine state in memory; it starts no VM.
	ModeRecorder Mode = "recorder"
	// ModeDisabled refuses every request with KindUnsupported.
	ModeDisabled Mode = "disabled"
)

// ParseMode parses a --qemu-mode value. An unknown mode is an error so that
// tetherd refuses to start rather than silently doing something else.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeReal, ModeRecorder, ModeDisabled:
		return m, nil
	}
	return "", fmt.Errorf("qemu: unknown mode %q (want real, recorder or disabled)", s)
}

// BootMode is how a VM boots (--qemu-boot).
type BootMode string

const (
	// BootDirect hands QEMU the kernel, the initramfs and the token
	// (fw_cfg): the fastest boot, and no firmware involved.
	BootDirect BootMode = "direct"
	// BootBIOS boots SeaBIOS and the NIC's iPXE option ROM, which fetches
	// everything over the network, as a bare-metal machine does.
	BootBIOS BootMode = "bios"
	// BootUEFI is BootBIOS with OVMF (UEFI) firmware.
	BootUEFI BootMode = "uefi"
	// BootUEFIHTTP is OVMF's own HTTP Boot with no iPXE: the NIC has no
	// option ROM, OVMF's PXE is off, and QEMU's DHCP (or tetherd's, on a
	// tap) hands the firmware the URL of the node's unified kernel image
	// (tetherd --uki, ADR 0035).
	BootUEFIHTTP BootMode = "uefi-http"
)

// ParseBootMode parses a --qemu-boot value.
func ParseBootMode(s string) (BootMode, error) {
	switch m := BootMode(s); m {
	case BootDirect, BootBIOS, BootUEFI, BootUEFIHTTP:
		return m, nil
	case "":
		return BootDirect, nil
	}
	return "", fmt.Errorf("qemu: unknown boot mode %q (want direct, bios, uefi or uefi-http)", s)
}

// Netboot reports whether VMs boot from their firmware over the network.
func (m BootMode) Netboot() bool { return m == BootBIOS || m.UEFI() }

// UEFI reports whether VMs boot OVMF.
func (m BootMode) UEFI() bool { return m == BootUEFI || m == BootUEFIHTTP }

// Debian's ovmf package. Secure Boot takes the 4 MiB build, whose
// variable store comes with the snakeoil key in PK, KEK and db.
const (
	defaultOVMFCode           = "/usr/share/OVMF/OVMF_CODE.fd"
	defaultOVMFVars           = "/usr/share/OVMF/OVMF_VARS.fd"
	defaultSecureBootOVMFCode = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd"
	defaultSecureBootOVMFVars = "/usr/share/OVMF/OVMF_VARS_4M.snakeoil.fd"
)

// Accelerator choices for Config.Accel.
const (
	AccelAuto = "auto"
	AccelKVM  = "kvm"
	AccelTCG  = "tcg"
)

// Config configures the provider. Zero values take the defaults below.
type Config struct {
	Mode Mode
	// Binary is the QEMU executable, looked up in PATH (default
	// qemu-system-x86_64).
	Binary string
	// StateDir holds one directory per instance (console log, QMP socket,
	// pid file). It is the provider's only memory: a restarted control
	// plane finds its VMs again from it. Required in real and recorder mode.
	StateDir string
	// MemoryMiB is the guest RAM (default 512).
	MemoryMiB int
	// CPUs is the number of vCPUs (default 1; under TCG -smp 2 is slower).
	CPUs int
	// Accel is auto, kvm or tcg (default auto: KVM when it is really
	// usable, else TCG; see kvmUsable).
	Accel string
	// StopGrace is how long Stop waits for an ACPI powerdown before it
	// quits QEMU (default 30 s). The agent hears the power button: in an
	// initramfs it powers off at once, under a systemd root it runs
	// systemctl poweroff, whose orderly shutdown takes seconds (tens of
	// them under TCG). Stop returns as soon as QEMU exits, so the grace is
	// used in full only by a guest that ignores the button.
	StopGrace time.Duration
	// QMPTimeout bounds one QMP exchange: connect, greeting, command and
	// answer (default 5 s).
	QMPTimeout time.Duration
	// LaunchTimeout bounds how long a new QEMU process has to answer on
	// QMP before it is killed (default 20 s).
	LaunchTimeout time.Duration
	// KillTimeout bounds each wait for the process to exit after quit and
	// after SIGKILL (default 5 s).
	KillTimeout time.Duration
	// RecorderLimit caps the entries recorder mode keeps, oldest dropped
	// first (default 1000), so a long-running recorder does not grow
	// without bound.
	RecorderLimit int
	// Boot is direct (default), bios or uefi.
	Boot BootMode
	// Tap, when set, puts the VM's NIC on this tap device (a bridge's
	// port, where tetherd's DHCP answers) instead of QEMU's user-mode
	// network. One tap carries one VM at a time.
	Tap string
	// OVMFCode and OVMFVars are the UEFI firmware and its variable store
	// template (each VM gets its own copy of the store); default Debian's.
	OVMFCode, OVMFVars string
	// TPM gives every VM a TPM 2.0 (--qemu-tpm): one swtpm per VM, with
	// the state of its node's TPM in StateDir/tpm/NODE, kept across the
	// node's instances. Real mode needs swtpm and swtpm-tools.
	TPM bool
	// SecureBoot boots OVMF with Secure Boot enforced
	// (--qemu-secure-boot): the secboot firmware, SMM on, and each VM a
	// copy of a variable store that holds the keys (default Debian's
	// snakeoil store, whose db key tests sign with). Needs Boot uefi or
	// uefi-http.
	SecureBoot bool
	Logger     *slog.Logger
	Clock      clock.Clock
}

const (
	defaultBinary        = "qemu-system-x86_64"
	defaultMemoryMiB     = 512
	defaultCPUs          = 1
	defaultStopGrace     = 30 * time.Second
	defaultQMPTimeout    = 5 * time.Second
	defaultLaunchTimeout = 20 * time.Second
	defaultKillTimeout   = 5 * time.Second
	defaultRecorderLimit = 1000
)

// withDefaults validates c and fills in defaults.
func (c Config) withDefaults() (Config, error) {
	var err error
	if _, err = ParseMode(string(c.Mode)); err != nil {
		return c, err
	}
	if c.Binary == "" {
		c.Binary = defaultBinary
	}
	if c.MemoryMiB < 0 || c.CPUs < 0 || c.StopGrace < 0 || c.QMPTimeout < 0 ||
		c.LaunchTimeout < 0 || c.KillTimeout < 0 || c.RecorderLimit < 0 {
		return c, fmt.Errorf("qemu: negative size or duration in config")
	}
	if c.MemoryMiB == 0 {
		c.MemoryMiB = defaultMemoryMiB
	}
	if c.CPUs == 0 {
		c.CPUs = defaultCPUs
	}
	switch c.Accel {
	case "":
		c.Accel = AccelAuto
	case AccelAuto, AccelKVM, AccelTCG:
	default:
		return c, fmt.Errorf("qemu: unknown accel %q (want auto, kvm or tcg)", c.Accel)
	}
	if c.StopGrace == 0 {
		c.StopGrace = defaultStopGrace
	}
	if c.QMPTimeout == 0 {
		c.QMPTimeout = defaultQMPTimeout
	}
	if c.LaunchTimeout == 0 {
		c.LaunchTimeout = defaultLaunchTimeout
	}
	if c.KillTimeout == 0 {
		c.KillTimeout = defaultKillTimeout
	}
	if c.RecorderLimit == 0 {
		c.RecorderLimit = defaultRecorderLimit
	}
	if c.Boot, err = ParseBootMode(string(c.Boot)); err != nil {
		return c, err
	}
	if c.Tap != "" && !validTap.MatchString(c.Tap) {
		return c, fmt.Errorf("qemu: tap %q is not an interface name (1-15 of [A-Za-z0-9_.-])", c.Tap)
	}
	if c.SecureBoot && !c.Boot.UEFI() {
		return c, fmt.Errorf("qemu: --qemu-secure-boot needs UEFI firmware: --qemu-boot uefi or uefi-http, not %s", c.Boot)
	}
	code, vars := defaultOVMFCode, defaultOVMFVars
	if c.SecureBoot {
		code, vars = defaultSecureBootOVMFCode, defaultSecureBootOVMFVars
	}
	if c.OVMFCode == "" {
		c.OVMFCode = code
	}
	if c.OVMFVars == "" {
		c.OVMFVars = vars
	}
	if c.Mode != ModeDisabled && c.StateDir == "" {
		return c, fmt.Errorf("qemu: StateDir is required in %s mode", c.Mode)
	}
	if c.TPM && strings.Contains(c.StateDir, ",") {
		return c, fmt.Errorf("qemu: --qemu-tpm: state dir %q has a comma, which swtpm's options cannot carry", c.StateDir)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	return c, nil
}

var validTap = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,15}$`)
