package qemu

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/providers"
)

func TestParseBootMode(t *testing.T) {
	for in, want := range map[string]BootMode{"": BootDirect, "direct": BootDirect, "bios": BootBIOS, "uefi": BootUEFI, "uefi-http": BootUEFIHTTP} {
		if got, err := ParseBootMode(in); err != nil || got != want {
			t.Errorf("ParseBootMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseBootMode("pxe"); err == nil || !strings.Contains(err.Error(), "direct, bios, uefi or uefi-http") {
		t.Errorf("ParseBootMode(pxe) error = %v", err)
	}
	if _, err := New(Config{Mode: ModeRecorder, StateDir: "/x", Tap: "tap0;rm"}); err == nil || !strings.Contains(err.Error(), "not an interface name") {
		t.Errorf("a bad tap name was accepted: %v", err)
	}
}

// TestNetbootArgv: in bios and uefi modes the VM gets its MAC and a
// firmware network boot, and none of the direct boot's kernel, command
// line, fw_cfg entries or token.
func TestNetbootArgv(t *testing.T) {
	boot := providers.Boot{
		KernelPath: "/blobs/k", InitramfsPath: "/blobs/i", KernelArgs: "console=ttyS0",
		KernelURL: "http://10.0.2.2:8080/artifacts/sha256:aa", InitramfsURL: "http://10.0.2.2:8080/artifacts/sha256:bb",
		Enrollment: providers.Enrollment{ControlPlaneURL: "https://10.0.2.2:7443", Token: "tbt_secret_token_value", CAFingerprint: "sha256:00"},
	}
	const mac = "52:54:00:12:34:56"
	tests := []struct {
		name    string
		cfg     Config
		want    []string
		netboot bool
	}{
		{name: "direct", cfg: Config{}, want: []string{"-kernel /blobs/k", "-netdev user,id=n0 ", "-device virtio-net-pci,netdev=n0 ", "opt/tether/token"}},
		{name: "bios, user network", cfg: Config{Boot: BootBIOS}, netboot: true, want: []string{
			"-boot n", "-netdev user,id=n0,bootfile=http://10.0.2.2:8080/ipxe/boot?mac=" + mac + " ", "-device virtio-net-pci,netdev=n0,mac=" + mac}},
		{name: "uefi, user network", cfg: Config{Boot: BootUEFI, OVMFCode: "/fw/CODE.fd"}, netboot: true, want: []string{
			"-drive if=pflash,format=raw,unit=0,readonly=on,file=/fw/CODE.fd", "-drive if=pflash,format=raw,unit=1,file=/st/inst-1/OVMF_VARS.fd", "-boot n"}},
		{name: "bios, tap", cfg: Config{Boot: BootBIOS, Tap: "tap7"}, netboot: true, want: []string{
			"-netdev tap,id=n0,ifname=tap7,script=no,downscript=no ", "mac=" + mac}},
		// OVMF's own HTTP Boot of the node's image: no option ROM (iPXE),
		// OVMF's PXE off, the image's URL from QEMU's DHCP.
		{name: "uefi-http, user network", cfg: Config{Boot: BootUEFIHTTP}, netboot: true, want: []string{
			"-M q35 ", "file=/usr/share/OVMF/OVMF_CODE.fd", "-netdev user,id=n0,bootfile=http://10.0.2.2:8080/uki/boot?mac=" + mac + " ",
			"-device virtio-net-pci,netdev=n0,mac=" + mac + ",romfile= ",
			"-fw_cfg name=opt/org.tianocore/IPv4PXESupport,string=n", "-fw_cfg name=opt/org.tianocore/IPv6PXESupport,string=n"}},
		{name: "uefi-http, tap", cfg: Config{Boot: BootUEFIHTTP, Tap: "tap7"}, netboot: true, want: []string{
			"-netdev tap,id=n0,ifname=tap7,script=no,downscript=no ", ",romfile= "}},
		// Secure Boot: the secboot firmware, its store with the snakeoil
		// keys, SMM, and flash only SMM may write.
		{name: "uefi-http, secure boot", cfg: Config{Boot: BootUEFIHTTP, SecureBoot: true}, netboot: true, want: []string{
			"-M q35,smm=on ", "-global driver=cfi.pflash01,property=secure,value=on",
			"-drive if=pflash,format=raw,unit=0,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.secboot.fd"}},
		{name: "uefi, secure boot", cfg: Config{Boot: BootUEFI, SecureBoot: true}, netboot: true, want: []string{
			"-M q35,smm=on ", "-global driver=cfi.pflash01,property=secure,value=on", "OVMF_CODE_4M.secboot.fd", "bootfile=http://10.0.2.2:8080/ipxe/boot?mac="}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Mode, tc.cfg.StateDir = ModeRecorder, "/st"
			p, err := New(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if p.Netboots() != tc.netboot {
				t.Errorf("Netboots() = %v, want %v", p.Netboots(), tc.netboot)
			}
			if _, err := p.Provision(context.Background(), providers.Spec{InstanceID: "inst-1", Boot: boot, MAC: mac}); err != nil {
				t.Fatal(err)
			}
			if _, err := p.Reboot(context.Background(), "inst-1", boot); err != nil {
				t.Fatal(err)
			}
			rec := p.Recorded()
			if len(rec) != 2 {
				t.Fatalf("recorded %d entries, want 2", len(rec))
			}
			for _, e := range rec {
				joined := strings.Join(e.Argv, " ") + " "
				for _, w := range tc.want {
					if !strings.Contains(joined, w) {
						t.Errorf("%s argv lacks %q:\n%s", e.Op, w, joined)
					}
				}
				if !tc.netboot {
					continue
				}
				for _, bad := range []string{"-kernel", "-initrd", "-append"} {
					if slices.Contains(e.Argv, bad) {
						t.Errorf("%s: a netbooting VM got %s:\n%s", e.Op, bad, joined)
					}
				}
				if strings.Contains(joined, "opt/tether/") {
					t.Errorf("%s: a netbooting VM got Tether fw_cfg entries:\n%s", e.Op, joined)
				}
				if tc.cfg.Boot != BootUEFIHTTP && strings.Contains(joined, "romfile=") {
					t.Errorf("%s: an iPXE boot lost its option ROM:\n%s", e.Op, joined)
				}
				for _, s := range e.Steps {
					if strings.Contains(s, "token") {
						t.Errorf("%s: a netbooting VM got a token file (%q)", e.Op, s)
					}
				}
			}
		})
	}
}

// Secure Boot is a property of UEFI firmware: refused for the others.
func TestSecureBootNeedsUEFI(t *testing.T) {
	for _, b := range []BootMode{BootDirect, BootBIOS} {
		if _, err := New(Config{Mode: ModeRecorder, StateDir: "/st", Boot: b, SecureBoot: true}); err == nil || !strings.Contains(err.Error(), "--qemu-secure-boot needs UEFI firmware") {
			t.Errorf("boot %s with Secure Boot: err %v", b, err)
		}
	}
	p, err := New(Config{Mode: ModeRecorder, StateDir: "/st", Boot: BootUEFIHTTP, SecureBoot: true, OVMFCode: "/fw/C.fd", OVMFVars: "/fw/V.fd"})
	if err != nil || p.cfg.OVMFCode != "/fw/C.fd" || p.cfg.OVMFVars != "/fw/V.fd" {
		t.Fatalf("given firmware files were replaced by the defaults: %v %+v", err, p.cfg)
	}
}

func TestNetbootRefusals(t *testing.T) {
	ctx := context.Background()
	p, err := New(Config{Mode: ModeRecorder, StateDir: "/st", Boot: BootBIOS})
	if err != nil {
		t.Fatal(err)
	}
	boot := providers.Boot{KernelURL: "http://10.0.2.2:8080/artifacts/sha256:aa"}
	for _, tc := range []struct {
		name string
		spec providers.Spec
		want string
	}{
		{"no MAC", providers.Spec{InstanceID: "a", Boot: boot}, "not a unicast MAC"},
		{"multicast MAC", providers.Spec{InstanceID: "b", Boot: boot, MAC: "01:00:5e:00:00:01"}, "not a unicast MAC"},
		{"MAC with dashes", providers.Spec{InstanceID: "c", Boot: boot, MAC: "52-54-00-12-34-56"}, "not a unicast MAC"},
		{"no netboot server", providers.Spec{InstanceID: "d", MAC: "52:54:00:12:34:56"}, "netboot server's URL"},
	} {
		_, err := p.Provision(ctx, tc.spec)
		if err == nil || !strings.Contains(err.Error(), tc.want) || providers.KindOf(err) != providers.KindPermanent {
			t.Errorf("%s: err = %v (kind %s), want a permanent error containing %q", tc.name, err, providers.KindOf(err), tc.want)
		}
	}
	if n := len(p.Recorded()); n != 0 {
		t.Errorf("refused provisions recorded %d launches", n)
	}
}
