package libvirt

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tetherfleet/tether/internal/clock"
)

// Name is the provider's registered name.
const Name = "libvirt"

// BootMode is how a domain boots (--libvirt-boot).
type BootMode string

const (
	// BootDirect hands libvirt the kernel, the initramfs and the
	// enrollment data (fw_cfg), as the qemu provider's direct mode does.
	BootDirect BootMode = "direct"
	// BootNetwork boots the domain's firmware from its NIC: iPXE fetches
	// the per-boot script from tetherd's netboot server.
	BootNetwork BootMode = "network"
	// BootUEFIHTTP is OVMF's own UEFI HTTP Boot of the node's signed
	// unified kernel image (tetherd --uki, ADR 0035): no option ROM on
	// the NIC, so no iPXE, and OVMF's PXE off. Needs --libvirt-firmware uefi.
	BootUEFIHTTP BootMode = "uefi-http"
)

// Netboot reports whether domains boot from their firmware over the network.
func (m BootMode) Netboot() bool { return m == BootNetwork || m == BootUEFIHTTP }

// ParseBootMode parses a --libvirt-boot value; "" is direct.
func ParseBootMode(s string) (BootMode, error) {
	switch m := BootMode(s); m {
	case BootDirect, BootNetwork, BootUEFIHTTP:
		return m, nil
	case "":
		return BootDirect, nil
	}
	return "", fmt.Errorf("libvirt: unknown boot mode %q (want direct, network or uefi-http)", s)
}

// Firmware is the domain's firmware (--libvirt-firmware).
type Firmware string

const (
	FirmwareBIOS Firmware = "bios" // SeaBIOS
	FirmwareUEFI Firmware = "uefi" // OVMF, with a per-domain NVRAM
)

// ParseFirmware parses a --libvirt-firmware value; "" is bios.
func ParseFirmware(s string) (Firmware, error) {
	switch f := Firmware(s); f {
	case FirmwareBIOS, FirmwareUEFI:
		return f, nil
	case "":
		return FirmwareBIOS, nil
	}
	return "", fmt.Errorf("libvirt: unknown firmware %q (want bios or uefi)", s)
}

// Domain types for Config.DomainType.
const (
	DomainTypeAuto = "auto"
	DomainTypeKVM  = "kvm"
	// DomainTypeQEMU is QEMU's TCG emulator: what a host without /dev/kvm
	// (a nested lab, CI) can run.
	DomainTypeQEMU = "qemu"
)

// Network is where a domain's NIC goes.
type Network struct {
	// Kind is user (QEMU's user-mode network: the guest reaches the host
	// as 10.0.2.2), network (a libvirt network) or bridge (a host bridge).
	Kind string
	// Name is the libvirt network or the bridge; empty for user.
	Name string
}

// ParseNetwork parses a --libvirt-network value: "user" (the default),
// "network:NAME" or "bridge:NAME".
func ParseNetwork(s string) (Network, error) {
	if s == "" || s == "user" {
		return Network{Kind: "user"}, nil
	}
	kind, name, ok := strings.Cut(s, ":")
	if ok && (kind == "network" || kind == "bridge") && validNetName.MatchString(name) {
		return Network{Kind: kind, Name: name}, nil
	}
	return Network{}, fmt.Errorf("libvirt: network %q: want user, network:NAME or bridge:NAME (NAME 1-64 of [A-Za-z0-9_.-])", s)
}

func (n Network) String() string {
	if n.Kind == "user" || n.Kind == "" {
		return "user"
	}
	return n.Kind + ":" + n.Name
}

// Debian's ovmf package. Secure Boot takes the 4 MiB build, whose
// variable store comes with the snakeoil key in PK, KEK and db.
const (
	defaultOVMFCode           = "/usr/share/OVMF/OVMF_CODE.fd"
	defaultOVMFVars           = "/usr/share/OVMF/OVMF_VARS.fd"
	defaultSecureBootOVMFCode = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd"
	defaultSecureBootOVMFVars = "/usr/share/OVMF/OVMF_VARS_4M.snakeoil.fd"
)

// DefaultURI is libvirtd's system instance on this host.
const DefaultURI = "qemu:///system"

// Config configures the provider. Zero values take the defaults below.
type Config struct {
	// URI names the libvirtd: qemu:///system (default), qemu:///session,
	// qemu+unix:///system?socket=PATH, qemu+tcp://HOST/system or
	// qemu+tls://HOST/system. Direct boot hands libvirtd paths on this
	// host (kernel, initramfs, token file), so it needs a local (unix
	// socket) libvirtd.
	URI string
	// StateDir holds one directory per instance: the console log and,
	// for the moment of a boot, the token file. QEMU must be able to
	// reach it (see FileOwner).
	StateDir string
	// DomainType is auto (default: kvm when the libvirtd host offers it,
	// else qemu), kvm or qemu (TCG).
	DomainType string
	// MachineType is the QEMU machine (default q35).
	MachineType string
	// TPM gives each domain a TPM 2.0 (tpm-crb) emulated by libvirtd's
	// swtpm (--libvirt-tpm). libvirtd keeps its state with the domain.
	TPM bool
	// MemoryMiB is the guest RAM (default 512); CPUs the vCPUs (default 1).
	MemoryMiB int
	CPUs      int
	Boot      BootMode
	Firmware  Firmware
	Network   Network
	// OVMFCode and OVMFVars are the UEFI firmware and the template of each
	// domain's own variable store (NVRAM); default Debian's.
	OVMFCode, OVMFVars string
	// SecureBoot boots OVMF with Secure Boot enforced
	// (--libvirt-secure-boot): the loader secure, SMM on, and each
	// domain's NVRAM a copy of a store that holds the keys (default
	// Debian's snakeoil store). Needs Firmware uefi.
	SecureBoot bool
	// FileOwner, "USER" or "UID:GID", owns the files QEMU reads or writes
	// (the instance directory, the token file, and copies of the kernel
	// and initramfs, which the control plane keeps private): the user
	// libvirtd runs QEMU as (libvirt-qemu under Debian's qemu:///system).
	// Empty: QEMU is handed the control plane's own files, which works
	// when QEMU runs as the same user.
	FileOwner string
	// StopGrace is how long Stop waits after an ACPI shutdown before it
	// destroys the domain (default 3 s; Tether's initramfs agent has no
	// ACPI handler, so a guest normally uses the whole grace).
	StopGrace time.Duration
	// CallTimeout bounds one session with libvirtd (connect and the calls
	// of one operation) when the caller's context has no earlier deadline
	// (default 30 s): go-libvirt's calls take no context.
	CallTimeout time.Duration
	Logger      *slog.Logger
	Clock       clock.Clock
}

const (
	defaultMemoryMiB   = 512
	defaultCPUs        = 1
	defaultMachine     = "q35"
	defaultStopGrace   = 3 * time.Second
	defaultCallTimeout = 30 * time.Second
)

// withDefaults validates c and fills in defaults.
func (c Config) withDefaults() (Config, error) {
	var err error
	if c.URI == "" {
		c.URI = DefaultURI
	}
	if _, err := parseURI(c.URI); err != nil {
		return c, err
	}
	if c.StateDir == "" {
		return c, fmt.Errorf("libvirt: StateDir is required")
	}
	if c.StateDir, err = filepath.Abs(c.StateDir); err != nil {
		return c, fmt.Errorf("libvirt: state dir: %w", err)
	}
	switch c.DomainType {
	case "":
		c.DomainType = DomainTypeAuto
	case DomainTypeAuto, DomainTypeKVM, DomainTypeQEMU:
	default:
		return c, fmt.Errorf("libvirt: unknown domain type %q (want auto, kvm or qemu)", c.DomainType)
	}
	if c.MachineType == "" {
		c.MachineType = defaultMachine
	}
	if c.MemoryMiB < 0 || c.CPUs < 0 || c.StopGrace < 0 || c.CallTimeout < 0 {
		return c, fmt.Errorf("libvirt: negative memory, vCPUs or duration in config")
	}
	if c.MemoryMiB == 0 {
		c.MemoryMiB = defaultMemoryMiB
	}
	if c.CPUs == 0 {
		c.CPUs = defaultCPUs
	}
	if c.Boot, err = ParseBootMode(string(c.Boot)); err != nil {
		return c, err
	}
	if c.Firmware, err = ParseFirmware(string(c.Firmware)); err != nil {
		return c, err
	}
	if c.Network, err = ParseNetwork(c.Network.String()); err != nil {
		return c, err
	}
	if c.Firmware != FirmwareUEFI {
		if c.SecureBoot {
			return c, errors.New("libvirt: --libvirt-secure-boot needs --libvirt-firmware uefi")
		}
		if c.Boot == BootUEFIHTTP {
			return c, errors.New("libvirt: --libvirt-boot uefi-http needs --libvirt-firmware uefi")
		}
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
	if c.FileOwner != "" {
		if _, _, err := lookupOwner(c.FileOwner); err != nil {
			return c, err
		}
	}
	if c.Boot == BootDirect {
		u, _ := parseURI(c.URI)
		if !u.local {
			return c, fmt.Errorf("libvirt: direct boot hands libvirtd files on this host (kernel, initramfs, token), so it needs a local libvirtd; %s is remote: use --libvirt-boot network", c.URI)
		}
	}
	if c.StopGrace == 0 {
		c.StopGrace = defaultStopGrace
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = defaultCallTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	return c, nil
}

// lookupOwner resolves FileOwner to a uid and gid.
func lookupOwner(s string) (uid, gid int, err error) {
	if u, g, ok := strings.Cut(s, ":"); ok {
		uid, err1 := strconv.Atoi(u)
		gid, err2 := strconv.Atoi(g)
		if err1 != nil || err2 != nil || uid < 0 || gid < 0 {
			return 0, 0, fmt.Errorf("libvirt: file owner %q: want USER or UID:GID (numbers)", s)
		}
		return uid, gid, nil
	}
	u, err := user.Lookup(s)
	if err != nil {
		return 0, 0, fmt.Errorf("libvirt: file owner %q: %w", s, err)
	}
	uid, _ = strconv.Atoi(u.Uid)
	gid, _ = strconv.Atoi(u.Gid)
	return uid, gid, nil
}

// target is a parsed libvirt URI: how to reach libvirtd and which driver
// URI to open there.
type target struct {
	transport string // unix, tcp or tls
	socket    string // unix
	host      string // tcp, tls (host or host:port)
	pkiPath   string // tls
	// remote is the URI libvirtd opens, e.g. qemu:///system.
	remote string
	local  bool
}

// libvirtd's default sockets.
const (
	systemSocket = "/var/run/libvirt/libvirt-sock"
	// sessionSocket is under $XDG_RUNTIME_DIR.
	sessionSocket = "libvirt/libvirt-sock"
)

// parseURI understands the URIs of the transports go-libvirt dials
// without shelling out: unix, tcp and tls.
func parseURI(s string) (target, error) {
	u, err := url.Parse(s)
	if err != nil {
		return target{}, fmt.Errorf("libvirt: URI %q: %w", s, err)
	}
	driver, transport, _ := strings.Cut(u.Scheme, "+")
	if driver != "qemu" {
		return target{}, fmt.Errorf("libvirt: URI %q: only the qemu driver is supported (qemu:///system, qemu:///session, qemu+tcp://..., qemu+tls://...)", s)
	}
	if u.Path != "/system" && u.Path != "/session" {
		return target{}, fmt.Errorf("libvirt: URI %q: the path must be /system or /session", s)
	}
	t := target{remote: "qemu://" + u.Path}
	if transport == "" {
		transport = "unix"
		if u.Host != "" {
			transport = "tls"
		}
	}
	q := u.Query()
	switch transport {
	case "unix":
		if u.Host != "" {
			return target{}, fmt.Errorf("libvirt: URI %q: a unix socket URI names no host", s)
		}
		t.transport, t.local = "unix", true
		t.socket = q.Get("socket")
		if t.socket == "" {
			t.socket = systemSocket
			if u.Path == "/session" {
				rt := os.Getenv("XDG_RUNTIME_DIR")
				if rt == "" {
					return target{}, fmt.Errorf("libvirt: URI %q: no XDG_RUNTIME_DIR to find the session socket in; add ?socket=PATH", s)
				}
				t.socket = filepath.Join(rt, sessionSocket)
			}
		}
	case "tcp", "tls":
		if u.Hostname() == "" {
			return target{}, fmt.Errorf("libvirt: URI %q: %s needs a host", s, transport)
		}
		t.transport, t.host, t.pkiPath = transport, u.Host, q.Get("pkipath")
	default:
		return target{}, fmt.Errorf("libvirt: URI %q: transport %q is not supported (want unix, tcp or tls; for ssh, forward libvirtd's socket and use ?socket=)", s, transport)
	}
	return t, nil
}
