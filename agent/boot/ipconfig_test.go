package boot

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

func TestParseIPParam(t *testing.T) {
	a := netip.MustParseAddr
	p := netip.MustParsePrefix
	tests := []struct {
		name    string
		in      string
		want    IPConfig
		wantOK  bool
		wantErr string // substring; "" means no error
		dhcp    bool   // error wraps ErrAutoconf
	}{
		{
			name:   "qemu user networking",
			in:     "10.0.2.15::10.0.2.2:255.255.255.0::eth0:off",
			want:   IPConfig{Client: p("10.0.2.15/24"), Gateway: a("10.0.2.2"), Device: "eth0"},
			wantOK: true,
		},
		{
			name: "every field",
			in:   "192.168.1.10:192.168.1.1:192.168.1.254:255.255.255.0:node-1.example:enp1s0:none:192.168.1.53:9.9.9.9:192.168.1.123",
			want: IPConfig{
				Client: p("192.168.1.10/24"), Server: a("192.168.1.1"), Gateway: a("192.168.1.254"),
				Hostname: "node-1.example", Device: "enp1s0",
				DNS: []netip.Addr{a("192.168.1.53"), a("9.9.9.9")}, NTP: a("192.168.1.123"),
			},
			wantOK: true,
		},
		{name: "client only, classful A", in: "10.1.2.3", want: IPConfig{Client: p("10.1.2.3/8")}, wantOK: true},
		{name: "classful B", in: "172.16.0.5:::", want: IPConfig{Client: p("172.16.0.5/16")}, wantOK: true},
		{name: "classful C", in: "192.0.2.7", want: IPConfig{Client: p("192.0.2.7/24")}, wantOK: true},
		{name: "no device, no gateway", in: "10.0.2.15:::255.255.0.0:::off", want: IPConfig{Client: p("10.0.2.15/16")}, wantOK: true},
		{name: "only dns1", in: "10.0.2.15::::::off::10.0.2.3", want: IPConfig{Client: p("10.0.2.15/8"), DNS: []netip.Addr{a("10.0.2.3")}}, wantOK: true},
		{name: "off", in: "off"},
		{name: "none", in: "none"},
		{name: "empty", in: "", wantErr: "empty value"},
		{name: "dhcp", in: "dhcp", wantErr: "automatic configuration", dhcp: true},
		{name: "autoconf field dhcp", in: "10.0.2.15::10.0.2.2:255.255.255.0::eth0:dhcp", wantErr: `autoconf field "dhcp"`, dhcp: true},
		{name: "missing client", in: "::10.0.2.2:255.255.255.0::eth0:off", wantErr: "client address (field 1) is empty", dhcp: true},
		{name: "bad autoconf", in: "10.0.2.15::::::static", wantErr: `autoconf field "static"`},
		{name: "bad client", in: "10.0.2.x::10.0.2.2:255.255.255.0::eth0:off", wantErr: `client address "10.0.2.x"`},
		{name: "ipv6 client", in: "fe80::1", wantErr: "is not a dotted-quad IPv4 address"},
		{name: "bad gateway", in: "10.0.2.15::gw:255.255.255.0::eth0:off", wantErr: `gateway "gw"`},
		{name: "gateway outside subnet", in: "10.0.2.15::10.0.3.1:255.255.255.0::eth0:off", wantErr: "not in the client's subnet 10.0.2.0/24"},
		{name: "prefix length as netmask", in: "10.0.2.15::10.0.2.2:24::eth0:off", wantErr: `netmask "24"`},
		{name: "non-contiguous netmask", in: "10.0.2.15::10.0.2.2:255.0.255.0::eth0:off", wantErr: "non-contiguous"},
		{name: "bad hostname", in: "10.0.2.15::::bad_name", wantErr: `character '_'`},
		{name: "long device", in: "10.0.2.15:::::abcdefghijklmnop:off", wantErr: "longer than 15 bytes"},
		{name: "device with slash", in: "10.0.2.15:::::eth/0:off", wantErr: "not a valid interface name"},
		{name: "bad dns", in: "10.0.2.15::::::off:dns", wantErr: `dns0 address "dns"`},
		{name: "bad ntp", in: "10.0.2.15::::::off:::ntp", wantErr: `ntp0 address "ntp"`},
		{name: "too many fields", in: "10.0.2.15::::::off::::x", wantErr: "11 fields"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok, err := ParseIPParam(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseIPParam(%q) error = %v, want it to contain %q", tc.in, err, tc.wantErr)
				}
				if !strings.Contains(err.Error(), "ip=") {
					t.Errorf("error %q does not name the ip= parameter", err)
				}
				if got := errors.Is(err, ErrAutoconf); got != tc.dhcp {
					t.Errorf("errors.Is(err, ErrAutoconf) = %v, want %v", got, tc.dhcp)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseIPParam(%q): %v", tc.in, err)
			}
			if ok != tc.wantOK {
				t.Fatalf("ok = %v, want %v", ok, tc.wantOK)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ParseIPParam(%q) = %+v, want %+v", tc.in, got, tc.want)
			}
			if ok {
				back, _, err := ParseIPParam(got.String())
				if err != nil || !reflect.DeepEqual(back, got) {
					t.Fatalf("round trip via %q = %+v, %v", got.String(), back, err)
				}
			}
		})
	}
}

func TestCmdlineParams(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"console=ttyS0 quiet\n", []string{"console=ttyS0", "quiet"}},
		{"  a=1\t b=2  ", []string{"a=1", "b=2"}},
		{`x="a b" y=c`, []string{"x=a b", "y=c"}},
		{`"quoted word" tail`, []string{"quoted word", "tail"}},
		{`x=""`, []string{"x="}},
		{`open="never closed`, []string{"open=never closed"}},
	}
	for _, tc := range tests {
		if got := CmdlineParams(tc.in); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("CmdlineParams(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestCmdlineValue(t *testing.T) {
	tests := []struct {
		cmdline, key, want string
		found              bool
	}{
		{"console=ttyS0 ip=10.0.2.15::10.0.2.2:255.255.255.0::eth0:off", "ip", "10.0.2.15::10.0.2.2:255.255.255.0::eth0:off", true},
		{"ip=off ip=10.0.2.15", "ip", "10.0.2.15", true}, // last one wins, as in the kernel
		{"noip=1 ipx=2", "ip", "", false},
		{"ip", "ip", "", false},
		{"ip=", "ip", "", true},
	}
	for _, tc := range tests {
		got, found := CmdlineValue(tc.cmdline, tc.key)
		if got != tc.want || found != tc.found {
			t.Errorf("CmdlineValue(%q, %q) = %q, %v; want %q, %v", tc.cmdline, tc.key, got, found, tc.want, tc.found)
		}
	}
}

// FuzzParseIPParam: a kernel command line is untrusted input. The parser must
// not panic, anything it accepts must be a usable IPv4 configuration, and
// its String form must read back to the same value.
func FuzzParseIPParam(f *testing.F) {
	for _, s := range []string{
		"10.0.2.15::10.0.2.2:255.255.255.0::eth0:off",
		"192.168.1.10:192.168.1.1:192.168.1.254:255.255.255.0:node:enp1s0:none:1.1.1.1:8.8.4.4:192.168.1.123",
		"dhcp", "off", "", ":::::::::", "10.0.2.15::::::off::::x", "1.2.3.4:::0.0.0.0", "fe80::1%eth0",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		cfg, ok, err := ParseIPParam(in)
		if err != nil || !ok {
			return
		}
		if !cfg.Client.IsValid() || !cfg.Client.Addr().Is4() || cfg.Client.Bits() < 0 || cfg.Client.Bits() > 32 {
			t.Fatalf("accepted %q with client %v", in, cfg.Client)
		}
		if cfg.Gateway.IsValid() && !cfg.Client.Masked().Contains(cfg.Gateway) {
			t.Fatalf("accepted %q with gateway %v outside %v", in, cfg.Gateway, cfg.Client)
		}
		if len(cfg.Device) > 15 || strings.ContainsAny(cfg.Device, "/: ") {
			t.Fatalf("accepted %q with device %q", in, cfg.Device)
		}
		back, ok, err := ParseIPParam(cfg.String())
		if err != nil || !ok || !reflect.DeepEqual(back, cfg) {
			t.Fatalf("round trip of %q via %q = %+v, %v, %v; want %+v", in, cfg.String(), back, ok, err, cfg)
		}
	})
}
