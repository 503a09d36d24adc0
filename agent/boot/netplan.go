package boot

import (
	"errors"
	"fmt"
	"net"
	"strings"
)

// NetKind is how the network gets configured.
type NetKind int

const (
	// NetNone: only lo (ip=off or ip=none).
	NetNone NetKind = iota
	// NetStatic: the static ip= configuration.
	NetStatic
	// NetDHCP: DHCP (v4, and v6/SLAAC where the network offers them).
	NetDHCP
)

// NetPlan is what the kernel command line asks of the network.
type NetPlan struct {
	Kind   NetKind
	Static IPConfig // NetStatic only

	// For NetDHCP:
	// Device limits DHCP to one interface (ip=:::::eth0:dhcp).
	Device string
	// BootMAC is the interface the machine booted from (BOOTIF=01-<mac>,
	// as pxelinux and iPXE scripts pass it): it is configured first.
	BootMAC net.HardwareAddr
	// Implicit is set when nothing on the command line asked for a
	// network: DHCP is tried on every interface with a carrier, and
	// finding no server is not an error.
	Implicit bool
}

// String says what the plan is, for the console.
func (p NetPlan) String() string {
	switch p.Kind {
	case NetNone:
		return "ip=off: only lo"
	case NetStatic:
		return "static ip=" + p.Static.String()
	}
	var why []string
	switch {
	case p.Device != "":
		why = append(why, "DHCP on "+p.Device)
	case p.BootMAC != nil:
		why = append(why, "DHCP on the boot interface "+p.BootMAC.String()+" first")
	default:
		why = append(why, "DHCP on every interface with a carrier")
	}
	if p.Implicit {
		why = append(why, "(no ip= on the kernel command line)")
	}
	return strings.Join(why, " ")
}

// PlanNetwork reads ip= and BOOTIF= from the kernel command line:
//
//   - ip=<static form> configures that address;
//   - ip=off or ip=none leaves only lo;
//   - ip=dhcp (or on, any, both; or the autoconf field of the long form
//     set to one of them) asks for DHCP, on the long form's device if it
//     names one;
//   - BOOTIF=01-aa-bb-cc-dd-ee-ff names the interface to try first;
//   - with neither ip= nor BOOTIF=, DHCP is tried on every interface with
//     a carrier: a netbooted node with only lo up is never what anyone wants.
//
// BOOTP and RARP are refused: only DHCP is implemented.
func PlanNetwork(cmdline string) (NetPlan, error) {
	var plan NetPlan
	if v, ok := CmdlineValue(cmdline, "BOOTIF"); ok {
		mac, err := ParseBOOTIF(v)
		if err != nil {
			return plan, err
		}
		plan.BootMAC = mac
	}
	value, present := CmdlineValue(cmdline, "ip")
	if !present {
		plan.Kind = NetDHCP
		plan.Implicit = plan.BootMAC == nil
		return plan, nil
	}
	cfg, ok, err := ParseIPParam(value)
	switch {
	case err == nil && !ok:
		return NetPlan{Kind: NetNone}, nil
	case err == nil:
		return NetPlan{Kind: NetStatic, Static: cfg}, nil
	case !errors.Is(err, ErrAutoconf):
		return NetPlan{}, err
	}
	fields := strings.Split(value, ":")
	field := func(i int) string {
		if i < len(fields) {
			return fields[i]
		}
		return ""
	}
	method := value
	if len(fields) > 1 {
		method = field(6)
		if plan.Device, err = parseDevice(field(5)); err != nil {
			return NetPlan{}, fmt.Errorf("boot: kernel parameter ip=%q: %w", value, err)
		}
	}
	switch method {
	case "dhcp", "on", "any", "both":
		plan.Kind = NetDHCP
		return plan, nil
	case "bootp", "rarp":
		return NetPlan{}, fmt.Errorf("boot: kernel parameter ip=%q: %s is not supported, only DHCP (ip=dhcp)", value, method)
	}
	// A long form with no client address and autoconf off: nothing to apply.
	return NetPlan{}, fmt.Errorf("boot: kernel parameter ip=%q: no client address and no autoconf method; use ip=dhcp or give an address", value)
}

// ParseBOOTIF parses pxelinux's BOOTIF value: the ARP hardware type (01,
// Ethernet) and the address, dash-separated: 01-52-54-00-12-34-56.
func ParseBOOTIF(v string) (net.HardwareAddr, error) {
	rest, ok := strings.CutPrefix(strings.ToLower(v), "01-")
	if !ok {
		return nil, fmt.Errorf("boot: kernel parameter BOOTIF=%q: want 01-<mac> with dashes (01 is the Ethernet hardware type)", v)
	}
	mac, err := net.ParseMAC(rest)
	if err != nil || len(mac) != 6 || strings.Contains(rest, ":") || strings.Contains(rest, ".") {
		return nil, fmt.Errorf("boot: kernel parameter BOOTIF=%q: %q is not a dash-separated 6-byte MAC address", v, rest)
	}
	return mac, nil
}
