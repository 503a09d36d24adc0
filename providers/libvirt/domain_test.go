package libvirt

import (
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"
)

func TestDomainXML(t *testing.T) {
	base := func() domainSpec {
		return domainSpec{Name: "tether-i-1", InstanceID: "i-1", Type: "qemu", Machine: "q35", MemoryMiB: 512, CPUs: 1,
			Boot: BootDirect, Firmware: FirmwareBIOS, Network: Network{Kind: "user"},
			Kernel: "/k/vmlinuz", Initramfs: "/k/initrd", KernelArgs: "quiet", URL: "https://10.0.2.2:7443",
			CA: "sha256:ab", Signers: []string{"sha256:s1", "sha256:s2"}, TokenFile: "/s/i-1/fw_cfg-token",
			Console: "/s/i-1/console.log", OVMFCode: "/fw/CODE.fd", OVMFVars: "/fw/VARS.fd"}
	}
	cases := []struct {
		name    string
		mod     func(*domainSpec)
		want    []string
		notWant []string
		err     string
	}{
		{name: "direct, bios, user network", want: []string{
			`<domain type="qemu">`, `<name>tether-i-1</name>`,
			`<tether:instance xmlns:tether="` + MetadataNS + `">i-1</tether:instance>`,
			`<memory unit="MiB">512</memory>`, `<vcpu>1</vcpu>`, `machine="q35"`,
			`<kernel>/k/vmlinuz</kernel>`, `<initrd>/k/initrd</initrd>`,
			`<cmdline>console=ttyS0 panic=-1 ` + userNetKernelArg + ` quiet</cmdline>`,
			`<sysinfo type="fwcfg">`, `<entry name="opt/tether/url">https://10.0.2.2:7443</entry>`,
			`<entry name="opt/tether/ca">sha256:ab</entry>`, `<entry name="opt/tether/signers">sha256:s1,sha256:s2</entry>`,
			`<entry name="opt/tether/token" file="/s/i-1/fw_cfg-token">`,
			`<interface type="user">`, `<model type="virtio">`, `<acpi>`,
			`<on_poweroff>destroy</on_poweroff>`, `<on_reboot>destroy</on_reboot>`, `<on_crash>destroy</on_crash>`,
			`<serial type="file">`, `path="/s/i-1/console.log" append="on"`, `<rng model="virtio">`,
			`<controller type="usb" model="none">`, `<memballoon model="none">`,
		}, notWant: []string{"<loader", "<nvram", "commandline", "<uuid>", "<tpm", "opt/tether/instance"}},
		{name: "TPM on q35: tpm-crb with libvirtd's swtpm", mod: func(s *domainSpec) { s.TPM = true },
			want: []string{`<tpm model="tpm-crb">`, `<backend type="emulator" version="2.0">`}},
		{name: "TPM on pc: tpm-tis", mod: func(s *domainSpec) { s.TPM, s.Machine = true, "pc" },
			want: []string{`<tpm model="tpm-tis">`}, notWant: []string{"tpm-crb"}},
		{name: "instance id in fw_cfg", mod: func(s *domainSpec) { s.Instance = "0b7e3c56-7b2c-4d1e-9d0a-6d1f2c3b4a59" },
			want: []string{`<entry name="opt/tether/instance">0b7e3c56-7b2c-4d1e-9d0a-6d1f2c3b4a59</entry>`}},
		{name: "tokenless boot: instance, no token", mod: func(s *domainSpec) { s.Instance, s.TokenFile = "i-1", "" },
			want: []string{`<entry name="opt/tether/instance">i-1</entry>`, `<entry name="opt/tether/url">`}, notWant: []string{"opt/tether/token"}},
		{name: "kvm, uefi, known uuid and mac", mod: func(s *domainSpec) {
			s.Type, s.Firmware, s.UUID, s.MAC = "kvm", FirmwareUEFI, "c3a7c1c7-a269-4a12-b085-37fba2baa882", "52:54:00:aa:bb:cc"
		}, want: []string{`<domain type="kvm">`, `<loader readonly="yes" type="pflash">/fw/CODE.fd</loader>`,
			`<nvram template="/fw/VARS.fd">`, `<uuid>c3a7c1c7-a269-4a12-b085-37fba2baa882</uuid>`, `<mac address="52:54:00:aa:bb:cc">`}},
		{name: "no token this boot", mod: func(s *domainSpec) { s.TokenFile = "" }, notWant: []string{"opt/tether/token"}},
		{name: "libvirt network: no static address", mod: func(s *domainSpec) { s.Network = Network{Kind: "network", Name: "lab"} },
			want:    []string{`<interface type="network">`, `<source network="lab">`, `<cmdline>console=ttyS0 panic=-1 quiet</cmdline>`},
			notWant: []string{"ip=10.0.2.15"}},
		{name: "bridge", mod: func(s *domainSpec) { s.Network = Network{Kind: "bridge", Name: "br0"} },
			want: []string{`<interface type="bridge">`, `<source bridge="br0">`}},
		{name: "netboot, user network", mod: func(s *domainSpec) {
			s.Boot, s.MAC, s.BootFile = BootNetwork, "52:54:00:aa:bb:cc", "http://10.0.2.2:8080/ipxe/boot?mac=52:54:00:aa:bb:cc"
		}, want: []string{`<commandline xmlns="http://libvirt.org/schemas/domain/qemu/1.0">`,
			`value="user,id=tethernet0,bootfile=http://10.0.2.2:8080/ipxe/boot?mac=52:54:00:aa:bb:cc"`,
			`value="virtio-net-pci,netdev=tethernet0,mac=52:54:00:aa:bb:cc,bootindex=1,bus=pcie.0,addr=0x10"`},
			notWant: []string{"<kernel>", "<interface", "fwcfg", "token"}},
		{name: "netboot, bios: SeaBIOS and iPXE on the serial console", mod: func(s *domainSpec) {
			s.Boot, s.MAC, s.BootFile = BootNetwork, "52:54:00:aa:bb:cc", "http://h/x"
		}, want: []string{`<bios useserial="yes">`}},
		{name: "netboot, uefi, machine pc", mod: func(s *domainSpec) {
			s.Boot, s.MAC, s.BootFile, s.Firmware, s.Machine = BootNetwork, "52:54:00:aa:bb:cc", "http://h/x", FirmwareUEFI, "pc"
		}, want: []string{"bus=pci.0,addr=0x10", "<loader"}, notWant: []string{"useserial"}},
		{name: "netboot, bootfile with a comma is escaped", mod: func(s *domainSpec) {
			s.Boot, s.MAC, s.BootFile = BootNetwork, "52:54:00:aa:bb:cc", "http://h/x,y"
		}, want: []string{"bootfile=http://h/x,,y"}},
		{name: "netboot, libvirt network", mod: func(s *domainSpec) {
			s.Boot, s.MAC, s.Network = BootNetwork, "52:54:00:aa:bb:cc", Network{Kind: "network", Name: "pxe"}
		}, want: []string{`<interface type="network">`, `<boot order="1">`, `<mac address="52:54:00:aa:bb:cc">`},
			notWant: []string{"commandline", "<kernel>"}},
		// UEFI HTTP Boot: no option ROM (no iPXE), OVMF's PXE off.
		{name: "uefi-http, user network", mod: func(s *domainSpec) {
			s.Boot, s.MAC, s.Firmware, s.BootFile = BootUEFIHTTP, "52:54:00:aa:bb:cc", FirmwareUEFI, "http://10.0.2.2:8080/uki/boot?mac=52:54:00:aa:bb:cc"
		}, want: []string{`value="user,id=tethernet0,bootfile=http://10.0.2.2:8080/uki/boot?mac=52:54:00:aa:bb:cc"`,
			`bus=pcie.0,addr=0x10,romfile="`, `<sysinfo type="fwcfg">`,
			`<entry name="opt/org.tianocore/IPv4PXESupport">n</entry>`, `<entry name="opt/org.tianocore/IPv6PXESupport">n</entry>`},
			notWant: []string{"opt/tether/", "<kernel>", "secure=", "<smm"}},
		{name: "uefi-http, bridge", mod: func(s *domainSpec) {
			s.Boot, s.MAC, s.Firmware, s.Network = BootUEFIHTTP, "52:54:00:aa:bb:cc", FirmwareUEFI, Network{Kind: "bridge", Name: "br0"}
		}, want: []string{`<interface type="bridge">`, `<rom enabled="no">`, `<boot order="1">`, "IPv4PXESupport"}},
		{name: "uefi-http on SeaBIOS", mod: func(s *domainSpec) {
			s.Boot, s.MAC, s.BootFile = BootUEFIHTTP, "52:54:00:aa:bb:cc", "http://h/x"
		}, err: "needs UEFI firmware"},
		{name: "secure boot", mod: func(s *domainSpec) {
			s.Boot, s.MAC, s.Firmware, s.BootFile, s.SecureBoot = BootUEFIHTTP, "52:54:00:aa:bb:cc", FirmwareUEFI, "http://h/x", true
		}, want: []string{`<loader readonly="yes" secure="yes" type="pflash">/fw/CODE.fd</loader>`, `<smm state="on">`, `<nvram template="/fw/VARS.fd">`}},
		{name: "iPXE netboot keeps its ROM", mod: func(s *domainSpec) {
			s.Boot, s.MAC, s.BootFile, s.Firmware = BootNetwork, "52:54:00:aa:bb:cc", "http://h/x", FirmwareUEFI
		}, notWant: []string{"romfile", "rom enabled", "tianocore"}},
		{name: "netboot without a MAC", mod: func(s *domainSpec) { s.Boot, s.BootFile = BootNetwork, "http://h/x" }, err: "hardware address"},
		{name: "netboot on user network without a boot file", mod: func(s *domainSpec) { s.Boot, s.MAC = BootNetwork, "52:54:00:aa:bb:cc" }, err: "netboot server"},
		{name: "direct without an initramfs", mod: func(s *domainSpec) { s.Initramfs = "" }, err: "initramfs"},
		{name: "bad instance id", mod: func(s *domainSpec) { s.InstanceID = "a<b" }, err: "invalid instance id"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := base()
			if tc.mod != nil {
				tc.mod(&s)
			}
			x, err := domainXML(s)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one naming %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(x, w) {
					t.Errorf("missing %q in\n%s", w, x)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(x, w) {
					t.Errorf("unexpected %q in\n%s", w, x)
				}
			}
			// What we write, libvirtxml reads back: the definition is
			// well-formed and the identity survives the round trip.
			var d libvirtxml.Domain
			if err := d.Unmarshal(x); err != nil {
				t.Fatalf("round trip: %v", err)
			}
			if d.Name != s.Name || d.UUID != s.UUID {
				t.Fatalf("round trip name/uuid = %q/%q", d.Name, d.UUID)
			}
		})
	}
}

func TestInstanceOf(t *testing.T) {
	cases := []struct {
		in, want, err string
	}{
		{in: "<instance>i-1</instance>", want: "i-1"},
		{in: `<instance xmlns="` + MetadataNS + `"> i-1 </instance>`, want: "i-1"},
		{in: "<node>i-1</node>", err: "want <instance>"},
		{in: "<instance>../etc</instance>", err: "not one"},
		{in: "<instance></instance>", err: "not one"},
		{in: "not xml", err: "domain metadata"},
	}
	for _, tc := range cases {
		got, err := instanceOf(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("instanceOf(%q) = %q, %v; want error %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("instanceOf(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestOffersKVM(t *testing.T) {
	guest := func(os, arch string, types ...string) string {
		s := "<guest><os_type>" + os + "</os_type><arch name='" + arch + "'>"
		for _, t := range types {
			s += "<domain type='" + t + "'/>"
		}
		return s + "</arch></guest>"
	}
	cases := []struct {
		name, caps string
		want       bool
		err        bool
	}{
		{"tcg only", "<capabilities>" + guest("hvm", "x86_64", "qemu") + "</capabilities>", false, false},
		{"kvm", "<capabilities>" + guest("hvm", "x86_64", "qemu", "kvm") + "</capabilities>", true, false},
		{"kvm for another arch only", "<capabilities>" + guest("hvm", "aarch64", "kvm") + guest("hvm", "x86_64", "qemu") + "</capabilities>", false, false},
		{"garbage", "<capab", false, true},
	}
	for _, tc := range cases {
		got, err := offersKVM(tc.caps)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("%s: offersKVM = %v, %v; want %v (error %v)", tc.name, got, err, tc.want, tc.err)
		}
	}
}
