package boot

import (
	"net"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

func TestPlanNetwork(t *testing.T) {
	mac := net.HardwareAddr{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}
	tests := []struct {
		name    string
		cmdline string
		want    NetPlan
		wantErr string
	}{
		{name: "nothing: DHCP everywhere", cmdline: "console=ttyS0 quiet", want: NetPlan{Kind: NetDHCP, Implicit: true}},
		{name: "ip=dhcp", cmdline: "ip=dhcp", want: NetPlan{Kind: NetDHCP}},
		{name: "ip=on", cmdline: "ip=on", want: NetPlan{Kind: NetDHCP}},
		{name: "ip=any", cmdline: "ip=any", want: NetPlan{Kind: NetDHCP}},
		{name: "ip=both", cmdline: "ip=both", want: NetPlan{Kind: NetDHCP}},
		{name: "ip=dhcp and BOOTIF", cmdline: "console=ttyS0 ip=dhcp BOOTIF=01-52-54-00-12-34-56", want: NetPlan{Kind: NetDHCP, BootMAC: mac}},
		{name: "BOOTIF upper case", cmdline: "ip=dhcp BOOTIF=01-52-54-00-12-34-56", want: NetPlan{Kind: NetDHCP, BootMAC: mac}},
		{name: "BOOTIF alone", cmdline: "BOOTIF=01-52-54-00-12-34-56", want: NetPlan{Kind: NetDHCP, BootMAC: mac}},
		{name: "long form with device", cmdline: "ip=:::::eth1:dhcp", want: NetPlan{Kind: NetDHCP, Device: "eth1"}},
		{name: "long form, address ignored for dhcp", cmdline: "ip=10.0.0.5:::255.0.0.0::eth0:dhcp", want: NetPlan{Kind: NetDHCP, Device: "eth0"}},
		{name: "static stays static", cmdline: "ip=10.0.2.15::10.0.2.2:255.255.255.0::eth0:off",
			want: NetPlan{Kind: NetStatic, Static: IPConfig{Client: netip.MustParsePrefix("10.0.2.15/24"), Gateway: netip.MustParseAddr("10.0.2.2"), Device: "eth0"}}},
		{name: "static with BOOTIF: static wins", cmdline: "BOOTIF=01-52-54-00-12-34-56 ip=10.1.2.3",
			want: NetPlan{Kind: NetStatic, Static: IPConfig{Client: netip.MustParsePrefix("10.1.2.3/8")}}},
		{name: "off", cmdline: "ip=off BOOTIF=01-52-54-00-12-34-56", want: NetPlan{Kind: NetNone}},
		{name: "none", cmdline: "ip=none", want: NetPlan{Kind: NetNone}},
		{name: "the last ip= wins", cmdline: "ip=off ip=dhcp", want: NetPlan{Kind: NetDHCP}},
		{name: "bootp refused", cmdline: "ip=bootp", wantErr: "bootp is not supported, only DHCP"},
		{name: "rarp in the long form refused", cmdline: "ip=:::::eth0:rarp", wantErr: "rarp is not supported"},
		{name: "no client, autoconf off", cmdline: "ip=::10.0.2.2:255.255.255.0::eth0:off", wantErr: "no client address and no autoconf method"},
		{name: "bad device with dhcp", cmdline: "ip=:::::eth/0:dhcp", wantErr: "not a valid interface name"},
		{name: "bad static", cmdline: "ip=10.0.2.x", wantErr: `client address "10.0.2.x"`},
		{name: "BOOTIF without type", cmdline: "ip=dhcp BOOTIF=52-54-00-12-34-56", wantErr: "want 01-<mac>"},
		{name: "BOOTIF with colons", cmdline: "ip=dhcp BOOTIF=01-52:54:00:12:34:56", wantErr: "not a dash-separated 6-byte MAC"},
		{name: "BOOTIF too long", cmdline: "BOOTIF=01-52-54-00-12-34-56-78-9a", wantErr: "not a dash-separated 6-byte MAC"},
		{name: "BOOTIF garbage", cmdline: "BOOTIF=01-zz", wantErr: `BOOTIF="01-zz"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PlanNetwork(tc.cmdline)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("PlanNetwork(%q) = %+v, %v; want error containing %q", tc.cmdline, got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("PlanNetwork(%q): %v", tc.cmdline, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("PlanNetwork(%q) = %+v, want %+v", tc.cmdline, got, tc.want)
			}
		})
	}
}

func TestNetPlanString(t *testing.T) {
	mac := net.HardwareAddr{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}
	for _, tc := range []struct {
		plan NetPlan
		want string
	}{
		{NetPlan{Kind: NetDHCP, Implicit: true}, "DHCP on every interface with a carrier (no ip= on the kernel command line)"},
		{NetPlan{Kind: NetDHCP, BootMAC: mac}, "DHCP on the boot interface 52:54:00:12:34:56 first"},
		{NetPlan{Kind: NetDHCP, Device: "eth1"}, "DHCP on eth1"},
		{NetPlan{Kind: NetNone}, "ip=off: only lo"},
	} {
		if got := tc.plan.String(); got != tc.want {
			t.Errorf("%+v.String() = %q, want %q", tc.plan, got, tc.want)
		}
	}
}
