package qemu

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/tetherfleet/tether/providers"
)

// Files in an instance directory.
const (
	consoleLogFile = "console.log"
	qmpSocketFile  = "qmp.sock"
	pidFile        = "qemu.pid"
	qemuLogFile    = "qemu.log"
	// tokenFile holds the one-time token only between writing it and QMP's
	// first answer: QEMU reads fw_cfg files at start-up, and a token in argv
	// would be visible to every user through ps.
	tokenFile = "fw_cfg-token"
	// macFile remembers a netbooting VM's hardware address for its later
	// boots (Start and Reboot get no Spec).
	macFile = "mac"
	// ovmfVarsFile is the VM's own UEFI variable store.
	ovmfVarsFile = "OVMF_VARS.fd"
	// nodeFile remembers the VM's node (whose TPM it gets) for its later
	// boots, as macFile does its MAC.
	nodeFile = "node"
	// The VM's swtpm (--qemu-tpm): its control socket, which QEMU's
	// -tpmdev emulator connects to, its pid file and its output.
	tpmSocketFile = "swtpm.sock"
	tpmPIDFile    = "swtpm.pid"
	tpmLogFile    = "swtpm.log"
)

// BootScriptPath is the control plane's boot route for a hardware address.
func BootScriptPath(mac string) string { return providers.BootScriptPath(mac) }

// fw_cfg names the agent reads (docs/design.md §3.2).
const (
	fwCfgURL   = "opt/tether/url"
	fwCfgToken = "opt/tether/token"
	fwCfgCA    = "opt/tether/ca"
	// fwCfgSigners is the node's signer anchor, comma-separated fingerprints.
	fwCfgSigners = "opt/tether/signers"
	// fwCfgInstance is the instance the boot is for: a tokenless (TPM)
	// boot has no token to name it by.
	fwCfgInstance = "opt/tether/instance"
)

// networkKernelArg lets the agent configure the network statically: with
// user-mode networking the guest is always 10.0.2.15 and reaches the host's
// loopback through 10.0.2.2, and a static address saves a DHCP round trip.
const networkKernelArg = "ip=10.0.2.15::10.0.2.2:255.255.255.0::eth0:off"

// baseKernelArgs come before the template's KernelArgs, so a template can
// override them (the kernel takes the last value of a repeated parameter).
// panic=-1 turns a guest panic into an immediate reboot, which -no-reboot
// turns into QEMU exiting: the machine then reads stopped instead of
// "running" with a dead kernel inside.
const baseKernelArgs = "console=ttyS0 panic=-1 " + networkKernelArg

// maxSocketPath is the longest path a unix socket can bind to (sun_path is
// 108 bytes including the terminating NUL).
const maxSocketPath = 107

// validID limits instance ids to names that are safe as one path element and
// inside QEMU option strings (no commas, slashes or dots-only names).
var validID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

func checkID(op, id string) error {
	if !validID.MatchString(id) {
		return errs.Permanent(op, id, fmt.Errorf("invalid instance id %q: want 1-64 of [A-Za-z0-9_.-], starting with a letter or digit", id))
	}
	if id == tpmDirName {
		return errs.Permanent(op, id, fmt.Errorf("instance id %q is reserved: the state directory keeps the nodes' TPMs there", id))
	}
	return nil
}

// instancePaths are the files of one instance.
type instancePaths struct {
	dir, console, qmp, pid, qemuLog, token, mac, ovmfVars string
	node, tpmSock, tpmPID, tpmLog                         string
}

func pathsFor(stateDir, id string) instancePaths {
	dir := filepath.Join(stateDir, id)
	return instancePaths{
		dir:      dir,
		console:  filepath.Join(dir, consoleLogFile),
		qmp:      filepath.Join(dir, qmpSocketFile),
		pid:      filepath.Join(dir, pidFile),
		qemuLog:  filepath.Join(dir, qemuLogFile),
		token:    filepath.Join(dir, tokenFile),
		mac:      filepath.Join(dir, macFile),
		ovmfVars: filepath.Join(dir, ovmfVarsFile),
		node:     filepath.Join(dir, nodeFile),
		tpmSock:  filepath.Join(dir, tpmSocketFile),
		tpmPID:   filepath.Join(dir, tpmPIDFile),
		tpmLog:   filepath.Join(dir, tpmLogFile),
	}
}

// qmpArg is the -qmp value. It doubles as the process's fingerprint: a pid
// from a pid file only counts as our VM when that process's command line
// carries exactly this argument (pids are reused).
func (p instancePaths) qmpArg() string {
	return "unix:" + optEscape(p.qmp) + ",server=on,wait=off"
}

// launchSpec is everything that goes on one QEMU command line.
type launchSpec struct {
	Binary     string
	InstanceID string
	Accel      string // kvm or tcg, already resolved
	MemoryMiB  int
	CPUs       int
	Paths      instancePaths
	Kernel     string
	Initramfs  string
	KernelArgs string
	URL        string
	CA         string
	Signers    []string
	// Instance is the fw_cfg instance entry (Enrollment.InstanceID);
	// empty: no entry.
	Instance string
	// WithToken adds the fw_cfg token entry, read from Paths.token.
	WithToken bool
	// TPM gives the VM a TPM 2.0 on the CRB interface, backed by the swtpm
	// listening on Paths.tpmSock. tpm-crb needs q35, which every VM gets.
	TPM bool

	// Boot is direct, bios or uefi. In bios and uefi the VM gets no
	// kernel, initramfs, command line or fw_cfg entry: its firmware's iPXE
	// fetches everything.
	Boot BootMode
	MAC  string // the NIC's address; empty: QEMU's default
	// Tap is the tap device of the NIC; empty: user-mode networking,
	// whose DHCP hands iPXE BootFile.
	Tap      string
	BootFile string
	OVMFCode string // uefi: firmware (read-only); its store is Paths.ovmfVars
	// SecureBoot: SMM on and the firmware's flash secure, as OVMF's
	// Secure Boot build needs.
	SecureBoot bool
}

// buildArgv returns the full QEMU command line, argv[0] included. It never
// contains the token itself, only the path of the file that holds it.
func buildArgv(s launchSpec) []string {
	machine := "q35"
	if s.SecureBoot {
		machine = "q35,smm=on"
	}
	argv := []string{
		s.Binary,
		"-name", "guest=" + optEscape("tether-"+s.InstanceID),
		"-M", machine,
		"-accel", s.Accel,
		"-cpu", cpuModel(s.Accel),
		"-m", strconv.Itoa(s.MemoryMiB),
		"-smp", strconv.Itoa(s.CPUs),
		"-nodefaults",
		"-nographic",
		"-no-reboot",
		"-netdev", netdevArg(s),
		"-device", nicArg(s),
		// Host entropy for the guest: without it the kernel's CRNG takes
		// ~1.5 s to initialise under TCG, and the agent's first
		// getrandom (its Ed25519 key) blocks until then.
		"-device", "virtio-rng-pci",
	}
	switch s.Boot {
	case BootBIOS:
		argv = append(argv, "-boot", "n")
	case BootUEFI, BootUEFIHTTP:
		if s.SecureBoot {
			// Only SMM code may write the variable store, so the guest
			// OS cannot change the keys.
			argv = append(argv, "-global", "driver=cfi.pflash01,property=secure,value=on")
		}
		argv = append(argv,
			"-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+optEscape(s.OVMFCode),
			"-drive", "if=pflash,format=raw,unit=1,file="+optEscape(s.Paths.ovmfVars),
			"-boot", "n")
		if s.Boot == BootUEFIHTTP {
			// OVMF tries PXE before HTTP on each NIC: switch it off, or
			// the boot waits out a TFTP failure and a DHCPv6 timeout.
			argv = append(argv,
				"-fw_cfg", "name=opt/org.tianocore/IPv4PXESupport,string=n",
				"-fw_cfg", "name=opt/org.tianocore/IPv6PXESupport,string=n")
		}
	default:
		argv = append(argv,
			"-kernel", s.Kernel,
			"-initrd", s.Initramfs,
			"-append", kernelCommandLine(s.KernelArgs))
	}
	argv = append(argv,
		// append=on keeps the console history of earlier boots of the
		// same instance, which is what an operator debugging a reboot
		// loop wants to read.
		"-chardev", "file,id=ser0,path="+optEscape(s.Paths.console)+",append=on",
		"-serial", "chardev:ser0",
		"-qmp", s.Paths.qmpArg(),
	)
	if s.TPM {
		argv = append(argv,
			"-chardev", "socket,id=chrtpm,path="+optEscape(s.Paths.tpmSock),
			"-tpmdev", "emulator,id=tpm0,chardev=chrtpm",
			"-device", "tpm-crb,tpmdev=tpm0")
	}
	if s.Boot.Netboot() {
		return argv
	}
	if s.URL != "" {
		argv = append(argv, "-fw_cfg", "name="+fwCfgURL+",string="+optEscape(s.URL))
	}
	if s.CA != "" {
		argv = append(argv, "-fw_cfg", "name="+fwCfgCA+",string="+optEscape(s.CA))
	}
	if len(s.Signers) > 0 {
		argv = append(argv, "-fw_cfg", "name="+fwCfgSigners+",string="+optEscape(strings.Join(s.Signers, ",")))
	}
	if s.Instance != "" {
		argv = append(argv, "-fw_cfg", "name="+fwCfgInstance+",string="+optEscape(s.Instance))
	}
	if s.WithToken {
		argv = append(argv, "-fw_cfg", "name="+fwCfgToken+",file="+optEscape(s.Paths.token))
	}
	return argv
}

// cpuModel is every CPU feature the accelerator can offer. QEMU's default
// model (qemu64) has no SSSE3, AVX or SHA extensions: under TCG the guest's
// SHA-256 and ChaCha20-Poly1305 then run 4-13x slower (1 MiB: 362 vs 27 ms
// and 246 vs 57 ms), which is most of a module fetch and verify. Under TCG
// AES-NI is left out: emulated, AES-GCM is several times slower than
// vectorised ChaCha20-Poly1305 (1 MiB: 328 vs 57 ms), and a guest without
// it makes TLS pick ChaCha20 (Go and OpenSSL both do). Under KVM, max is
// the host's CPU, AES-NI included. docs/benchmarks.md has the numbers.
func cpuModel(accel string) string {
	if accel == AccelTCG {
		return "max,aes=off"
	}
	return "max"
}

func kernelCommandLine(extra string) string {
	extra = strings.TrimSpace(extra)
	if extra == "" {
		return baseKernelArgs
	}
	return baseKernelArgs + " " + extra
}

// optEscape escapes a value inside a QEMU -opt a=b,c=d string, where a comma
// is written as two.
func optEscape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// minSecretLen is the shortest secret redact looks for: replacing a very
// short string would mangle the whole command line, and real tokens are 256
// bits.
const minSecretLen = 8

// redact replaces every occurrence of the given secrets in argv. The argv we
// build carries no secret; this is the belt to that brace, applied to
// everything we log or record.
func redact(argv []string, secrets ...string) []string {
	out := make([]string, len(argv))
	for i, a := range argv {
		for _, s := range secrets {
			if len(s) >= minSecretLen {
				a = strings.ReplaceAll(a, s, "<redacted>")
			}
		}
		out[i] = a
	}
	return out
}

// netdevArg is the VM's network: a tap on a bridge, or QEMU's user-mode
// network, whose built-in DHCP points a netbooting iPXE at BootFile.
func netdevArg(s launchSpec) string {
	if s.Tap != "" {
		return "tap,id=n0,ifname=" + optEscape(s.Tap) + ",script=no,downscript=no"
	}
	if s.Boot.Netboot() && s.BootFile != "" {
		return "user,id=n0,bootfile=" + optEscape(s.BootFile)
	}
	return "user,id=n0"
}

func nicArg(s launchSpec) string {
	nic := "virtio-net-pci,netdev=n0"
	if s.MAC != "" {
		nic += ",mac=" + s.MAC
	}
	if s.Boot == BootUEFIHTTP {
		// No option ROM: QEMU's is iPXE, and this boot has none.
		nic += ",romfile="
	}
	return nic
}
