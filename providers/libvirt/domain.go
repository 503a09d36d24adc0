package libvirt

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"libvirt.org/go/libvirtxml"
)

// MetadataNS is the XML namespace of the element that tags a domain with
// its Tether instance id:
//
//	<metadata><tether:instance xmlns:tether="urn:tetherfleet:libvirt:instance:1">ID</tether:instance></metadata>
//
// List only reports domains that carry it, so a libvirtd shared with other
// tools shows Tether nothing of theirs.
const MetadataNS = "urn:tetherfleet:libvirt:instance:1"

// DomainPrefix starts every domain name: the domain of instance ID is
// "tether-ID", which is what makes Provision idempotent by instance id.
const DomainPrefix = "tether-"

// DomainName is the libvirt domain name of an instance.
func DomainName(instanceID string) string { return DomainPrefix + instanceID }

// fw_cfg names the agent reads (docs/design.md §3.2), the same as the qemu
// provider's.
const (
	fwCfgURL     = "opt/tether/url"
	fwCfgToken   = "opt/tether/token"
	fwCfgCA      = "opt/tether/ca"
	fwCfgSigners = "opt/tether/signers"
	// fwCfgInstance is the instance the boot is for: a tokenless (TPM)
	// boot has no token to name it by.
	fwCfgInstance = "opt/tether/instance"
)

// userNetKernelArg configures the agent's network statically on QEMU's
// user-mode network (the guest is always 10.0.2.15 and reaches the host
// through 10.0.2.2), saving a DHCP round trip, as the qemu provider does.
const userNetKernelArg = "ip=10.0.2.15::10.0.2.2:255.255.255.0::eth0:off"

// baseKernelArgs come before the template's, so a template can override
// them (the kernel takes the last value of a repeated parameter). panic=-1
// turns a guest panic into a reboot, which on_reboot=destroy turns into a
// stopped domain rather than "running" with a dead kernel inside.
const baseKernelArgs = "console=ttyS0 panic=-1"

// netbootNetdev is the id of the NIC a netbooting domain gets on QEMU's
// user-mode network (see domainXML).
const netbootNetdev = "tethernet0"

// netbootNICSlot places that NIC on the root bus in a slot libvirtd does
// not hand out (it fills slots from 1 up, with root ports for its own
// devices): a device without an address would take slot 1 and collide.
const netbootNICSlot = "addr=0x10"

// rootBus is the machine type's root PCI bus.
func rootBus(machine string) string {
	if strings.Contains(machine, "q35") {
		return "pcie.0"
	}
	return "pci.0"
}

var (
	// validID limits instance ids to names safe as a path element and in
	// a domain name.
	validID      = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)
	validNetName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)
)

// domainSpec is everything that goes into one domain definition.
type domainSpec struct {
	Name, UUID, InstanceID string
	Type                   string // kvm or qemu, already resolved
	Machine                string
	MemoryMiB, CPUs        int
	Boot                   BootMode
	Firmware               Firmware
	OVMFCode, OVMFVars     string
	// SecureBoot: the loader secure and SMM on (OVMF's Secure Boot
	// build needs both).
	SecureBoot bool
	Network    Network
	// MAC is the NIC's address; empty: libvirt picks one.
	MAC string
	// BootFile is what QEMU's user-mode DHCP hands a netbooting iPXE.
	BootFile string
	// Direct boot.
	Kernel, Initramfs, KernelArgs string
	URL, CA                       string
	Signers                       []string
	// Instance is the fw_cfg instance entry (Enrollment.InstanceID);
	// empty: no entry.
	Instance string
	// TPM adds a TPM 2.0 on the CRB interface, emulated by swtpm, which
	// libvirtd starts and stops with the domain.
	TPM bool
	// TokenFile is the fw_cfg token's file; empty: no token entry. The
	// token itself never appears in the definition (libvirtd keeps it on
	// disk and QEMU's argv shows it to every user of the host).
	TokenFile string
	Console   string
}

// domainXML renders the definition libvirtd is given.
func domainXML(s domainSpec) (string, error) {
	if !validID.MatchString(s.InstanceID) {
		return "", fmt.Errorf("invalid instance id %q", s.InstanceID)
	}
	var meta bytes.Buffer
	meta.WriteString(`<tether:instance xmlns:tether="` + MetadataNS + `">`)
	if err := xml.EscapeText(&meta, []byte(s.InstanceID)); err != nil {
		return "", err
	}
	meta.WriteString(`</tether:instance>`)

	port := uint(0)
	d := &libvirtxml.Domain{
		Type:     s.Type,
		Name:     s.Name,
		UUID:     s.UUID,
		Metadata: &libvirtxml.DomainMetadata{XML: meta.String()},
		Memory:   &libvirtxml.DomainMemory{Value: uint(s.MemoryMiB), Unit: "MiB"},
		VCPU:     &libvirtxml.DomainVCPU{Value: uint(s.CPUs)},
		OS: &libvirtxml.DomainOS{
			Type: &libvirtxml.DomainOSType{Arch: "x86_64", Machine: s.Machine, Type: "hvm"},
		},
		// ACPI is what DomainShutdown presses the power button of.
		Features: &libvirtxml.DomainFeatureList{ACPI: &libvirtxml.DomainFeature{}, APIC: &libvirtxml.DomainFeatureAPIC{}},
		// A guest that powers off, reboots or crashes stops: a reboot
		// would replay the spent one-time token; a fresh boot goes
		// through Start or Reboot, which bring a new one.
		OnPoweroff: "destroy",
		OnReboot:   "destroy",
		OnCrash:    "destroy",
		Devices: &libvirtxml.DomainDeviceList{
			Serials: []libvirtxml.DomainSerial{{
				// append keeps the console of earlier boots, which is what
				// an operator debugging a reboot loop reads.
				Source: &libvirtxml.DomainChardevSource{File: &libvirtxml.DomainChardevSourceFile{Path: s.Console, Append: "on"}},
				Target: &libvirtxml.DomainSerialTarget{Port: &port},
			}},
			// Host entropy: without it the guest kernel's CRNG takes
			// seconds under TCG and the agent's first getrandom waits.
			RNGs: []libvirtxml.DomainRNG{{Model: "virtio",
				Backend: &libvirtxml.DomainRNGBackend{Random: &libvirtxml.DomainRNGBackendRandom{Device: "/dev/urandom"}}}},
			// No USB controller and no balloon: libvirtd adds both unless
			// told not to, and under TCG every device the firmware and the
			// kernel probe costs boot time the machine does not use.
			Controllers: []libvirtxml.DomainController{{Type: "usb", Model: "none"}},
			MemBalloon:  &libvirtxml.DomainMemBalloon{Model: "none"},
		},
	}
	if s.TPM {
		// tpm-crb is the TPM 2.0 interface the guest kernel drives with
		// tpm_crb; it needs q35 (on pc the choice would be tpm-tis).
		model := "tpm-crb"
		if !strings.Contains(s.Machine, "q35") {
			model = "tpm-tis"
		}
		d.Devices.TPMs = []libvirtxml.DomainTPM{{Model: model,
			Backend: &libvirtxml.DomainTPMBackend{Emulator: &libvirtxml.DomainTPMBackendEmulator{Version: "2.0"}}}}
	}
	if s.Firmware == FirmwareUEFI {
		d.OS.Loader = &libvirtxml.DomainLoader{Path: s.OVMFCode, Readonly: "yes", Type: "pflash"}
		// libvirtd copies the template into the domain's own NVRAM file
		// on first boot; terminate removes it (undefine with NVRAM).
		d.OS.NVRam = &libvirtxml.DomainNVRam{Template: s.OVMFVars}
		if s.SecureBoot {
			// Only SMM code may write the variable store, so the guest
			// cannot change the keys.
			d.OS.Loader.Secure = "yes"
			d.Features.SMM = &libvirtxml.DomainFeatureSMM{State: "on"}
		}
	}

	if s.Boot.Netboot() {
		if s.Boot == BootUEFIHTTP {
			if s.Firmware != FirmwareUEFI {
				return "", errors.New("UEFI HTTP Boot needs UEFI firmware")
			}
			// OVMF tries PXE before HTTP on each NIC: switch it off, or
			// the boot waits out a TFTP failure and a DHCPv6 timeout.
			d.SysInfo = []libvirtxml.DomainSysInfo{{FWCfg: &libvirtxml.DomainSysInfoFWCfg{Entry: []libvirtxml.DomainSysInfoEntry{
				{Name: "opt/org.tianocore/IPv4PXESupport", Value: "n"}, {Name: "opt/org.tianocore/IPv6PXESupport", Value: "n"}}}}}
		}
		if s.Firmware == FirmwareBIOS {
			// SeaBIOS and iPXE write to the serial console only when
			// asked: without it the console of a netboot starts with the
			// kernel, and an operator cannot see a DHCP or fetch fail.
			d.OS.BIOS = &libvirtxml.DomainBIOS{UseSerial: "yes"}
		}
		if s.MAC == "" {
			return "", errors.New("a netbooting domain needs a hardware address (the node's MAC), and none was given")
		}
		if s.Network.Kind == "user" {
			if s.BootFile == "" {
				return "", errors.New("netboot over QEMU's user-mode network needs the netboot server's URL")
			}
			// libvirt has no way to set the user-mode network's bootfile
			// (the DHCP option that points iPXE at tetherd), so this NIC
			// is given to QEMU directly. libvirtd marks the domain
			// tainted (custom-argv), which is all it costs.
			d.QEMUCommandline = &libvirtxml.DomainQEMUCommandline{Args: []libvirtxml.DomainQEMUCommandlineArg{
				{Value: "-netdev"}, {Value: "user,id=" + netbootNetdev + ",bootfile=" + optEscape(s.BootFile)},
				{Value: "-device"}, {Value: "virtio-net-pci,netdev=" + netbootNetdev + ",mac=" + s.MAC + ",bootindex=1,bus=" + rootBus(s.Machine) + "," + netbootNICSlot + noROM(s)},
			}}
		} else {
			nic := nicFor(s)
			nic.Boot = &libvirtxml.DomainDeviceBoot{Order: 1}
			if s.Boot == BootUEFIHTTP {
				nic.ROM = &libvirtxml.DomainROM{Enabled: "no"}
			}
			d.Devices.Interfaces = []libvirtxml.DomainInterface{nic}
		}
		return d.Marshal()
	}

	if s.Kernel == "" || s.Initramfs == "" {
		return "", errors.New("direct boot needs a kernel path and an initramfs path")
	}
	d.Devices.Interfaces = []libvirtxml.DomainInterface{nicFor(s)}
	d.OS.Kernel, d.OS.Initrd = s.Kernel, s.Initramfs
	d.OS.Cmdline = kernelCommandLine(s.Network, s.KernelArgs)
	var entries []libvirtxml.DomainSysInfoEntry
	if s.URL != "" {
		entries = append(entries, libvirtxml.DomainSysInfoEntry{Name: fwCfgURL, Value: s.URL})
	}
	if s.CA != "" {
		entries = append(entries, libvirtxml.DomainSysInfoEntry{Name: fwCfgCA, Value: s.CA})
	}
	if len(s.Signers) > 0 {
		entries = append(entries, libvirtxml.DomainSysInfoEntry{Name: fwCfgSigners, Value: strings.Join(s.Signers, ",")})
	}
	if s.Instance != "" {
		entries = append(entries, libvirtxml.DomainSysInfoEntry{Name: fwCfgInstance, Value: s.Instance})
	}
	if s.TokenFile != "" {
		entries = append(entries, libvirtxml.DomainSysInfoEntry{Name: fwCfgToken, File: s.TokenFile})
	}
	if len(entries) > 0 {
		d.SysInfo = []libvirtxml.DomainSysInfo{{FWCfg: &libvirtxml.DomainSysInfoFWCfg{Entry: entries}}}
	}
	return d.Marshal()
}

// noROM leaves the NIC without its option ROM (QEMU's is iPXE) for UEFI
// HTTP Boot, which has none.
func noROM(s domainSpec) string {
	if s.Boot == BootUEFIHTTP {
		return ",romfile="
	}
	return ""
}

func nicFor(s domainSpec) libvirtxml.DomainInterface {
	nic := libvirtxml.DomainInterface{Model: &libvirtxml.DomainInterfaceModel{Type: "virtio"}}
	if s.MAC != "" {
		nic.MAC = &libvirtxml.DomainInterfaceMAC{Address: s.MAC}
	}
	switch s.Network.Kind {
	case "network":
		nic.Source = &libvirtxml.DomainInterfaceSource{Network: &libvirtxml.DomainInterfaceSourceNetwork{Network: s.Network.Name}}
	case "bridge":
		nic.Source = &libvirtxml.DomainInterfaceSource{Bridge: &libvirtxml.DomainInterfaceSourceBridge{Bridge: s.Network.Name}}
	default:
		nic.Source = &libvirtxml.DomainInterfaceSource{User: &libvirtxml.DomainInterfaceSourceUser{}}
	}
	return nic
}

func kernelCommandLine(n Network, extra string) string {
	base := baseKernelArgs
	if n.Kind == "user" {
		base += " " + userNetKernelArg
	}
	if extra = strings.TrimSpace(extra); extra != "" {
		return base + " " + extra
	}
	return base
}

// optEscape escapes a value inside a QEMU -opt a=b,c=d string, where a
// comma is written as two.
func optEscape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// instanceOf parses the metadata element DomainGetMetadata returns for
// MetadataNS (libvirtd hands it back without our prefix).
func instanceOf(metadata string) (string, error) {
	var el struct {
		XMLName xml.Name
		Value   string `xml:",chardata"`
	}
	if err := xml.Unmarshal([]byte(metadata), &el); err != nil {
		return "", fmt.Errorf("domain metadata %q: %w", metadata, err)
	}
	if el.XMLName.Local != "instance" {
		return "", fmt.Errorf("domain metadata: element <%s>, want <instance>", el.XMLName.Local)
	}
	id := strings.TrimSpace(el.Value)
	if !validID.MatchString(id) {
		return "", fmt.Errorf("domain metadata: instance id %q is not one", id)
	}
	return id, nil
}

// offersKVM reports whether libvirtd's capabilities list a kvm domain type
// for x86_64 guests.
func offersKVM(capsXML string) (bool, error) {
	var caps libvirtxml.Caps
	if err := caps.Unmarshal(capsXML); err != nil {
		return false, fmt.Errorf("libvirtd capabilities: %w", err)
	}
	for _, g := range caps.Guests {
		if g.OSType != "hvm" || g.Arch.Name != "x86_64" {
			continue
		}
		for _, d := range g.Arch.Domains {
			if d.Type == DomainTypeKVM {
				return true, nil
			}
		}
	}
	return false, nil
}
