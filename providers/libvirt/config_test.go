package libvirt

import (
	"strings"
	"testing"
)

func TestParseURI(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", "/run/user/1000")
	cases := []struct {
		uri  string
		want target
		err  string
	}{
		{uri: "qemu:///system", want: target{transport: "unix", socket: systemSocket, remote: "qemu:///system", local: true}},
		{uri: "qemu:///session", want: target{transport: "unix", socket: "/run/user/1000/libvirt/libvirt-sock", remote: "qemu:///session", local: true}},
		{uri: "qemu+unix:///session?socket=/tmp/s", want: target{transport: "unix", socket: "/tmp/s", remote: "qemu:///session", local: true}},
		{uri: "qemu+tcp://lab1/system", want: target{transport: "tcp", host: "lab1", remote: "qemu:///system"}},
		{uri: "qemu+tls://lab1:16514/system?pkipath=/etc/pki", want: target{transport: "tls", host: "lab1:16514", pkiPath: "/etc/pki", remote: "qemu:///system"}},
		{uri: "qemu://lab1/system", want: target{transport: "tls", host: "lab1", remote: "qemu:///system"}},
		{uri: "xen:///system", err: "only the qemu driver"},
		{uri: "qemu:///embed?root=/x", err: "/system or /session"},
		{uri: "qemu+ssh://lab1/system", err: "not supported"},
		{uri: "qemu+tcp:///system", err: "needs a host"},
		{uri: "qemu+unix://lab1/system", err: "names no host"},
		{uri: "::", err: "URI"},
	}
	for _, tc := range cases {
		got, err := parseURI(tc.uri)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("parseURI(%q) = %+v, %v; want error %q", tc.uri, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("parseURI(%q) = %+v, %v; want %+v", tc.uri, got, err, tc.want)
		}
	}
}

func TestConfigDefaultsAndRefusals(t *testing.T) {
	c, err := Config{StateDir: "/s"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.URI != DefaultURI || c.DomainType != DomainTypeAuto || c.MemoryMiB != 512 || c.CPUs != 1 || c.Boot != BootDirect ||
		c.Firmware != FirmwareBIOS || c.Network.Kind != "user" || c.MachineType != "q35" || c.StopGrace == 0 || c.CallTimeout == 0 {
		t.Fatalf("defaults = %+v", c)
	}
	cases := []struct {
		name string
		cfg  Config
		err  string
	}{
		{"no state dir", Config{}, "StateDir"},
		{"bad domain type", Config{StateDir: "/s", DomainType: "xen"}, "domain type"},
		{"negative memory", Config{StateDir: "/s", MemoryMiB: -1}, "negative"},
		{"bad boot", Config{StateDir: "/s", Boot: "pxe"}, "boot mode"},
		{"bad firmware", Config{StateDir: "/s", Firmware: "coreboot"}, "firmware"},
		{"bad network", Config{StateDir: "/s", Network: Network{Kind: "vde", Name: "x"}}, "network"},
		{"bad owner", Config{StateDir: "/s", FileOwner: "1:x"}, "file owner"},
		{"unknown owner", Config{StateDir: "/s", FileOwner: "no-such-user-here"}, "file owner"},
		{"direct boot on a remote libvirtd", Config{StateDir: "/s", URI: "qemu+tcp://lab1/system"}, "local libvirtd"},
		{"secure boot on SeaBIOS", Config{StateDir: "/s", SecureBoot: true}, "--libvirt-secure-boot needs --libvirt-firmware uefi"},
		{"uefi-http on SeaBIOS", Config{StateDir: "/s", Boot: BootUEFIHTTP, URI: "qemu+tcp://lab1/system"}, "uefi-http needs --libvirt-firmware uefi"},
	}
	for _, tc := range cases {
		if _, err := tc.cfg.withDefaults(); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: err = %v, want one naming %q", tc.name, err, tc.err)
		}
	}
	if _, err := (Config{StateDir: "/s", URI: "qemu+tcp://lab1/system", Boot: BootNetwork}).withDefaults(); err != nil {
		t.Errorf("network boot on a remote libvirtd refused: %v", err)
	}
	// Secure Boot takes the secboot firmware and the store with the keys.
	sb, err := Config{StateDir: "/s", URI: "qemu+tcp://lab1/system", Boot: BootUEFIHTTP, Firmware: FirmwareUEFI, SecureBoot: true}.withDefaults()
	if err != nil || sb.OVMFCode != defaultSecureBootOVMFCode || sb.OVMFVars != defaultSecureBootOVMFVars || !sb.Boot.Netboot() {
		t.Errorf("secure boot config %+v, %v", sb, err)
	}
}

func TestParseNetwork(t *testing.T) {
	cases := []struct {
		in   string
		want Network
		err  bool
	}{
		{"", Network{Kind: "user"}, false},
		{"user", Network{Kind: "user"}, false},
		{"network:default", Network{Kind: "network", Name: "default"}, false},
		{"bridge:br0", Network{Kind: "bridge", Name: "br0"}, false},
		{"bridge:", Network{}, true},
		{"tap:tap0", Network{}, true},
		{"network:a b", Network{}, true},
	}
	for _, tc := range cases {
		got, err := ParseNetwork(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ParseNetwork(%q) = %+v, %v", tc.in, got, err)
		}
	}
}
