package boot

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// IPConfig is the static network configuration of the kernel's `ip=`
// parameter (Documentation/admin-guide/nfs/nfsroot.rst):
//
//	ip=<client-ip>:<server-ip>:<gw-ip>:<netmask>:<hostname>:<device>:<autoconf>:<dns0-ip>:<dns1-ip>:<ntp0-ip>
//
// The kernel itself does not apply it here (CONFIG_IP_PNP is off in Debian's
// kernels), so the agent does, which is why the format is the kernel's: the
// same command line works for both.
type IPConfig struct {
	Client   netip.Prefix // address and prefix length of this host
	Server   netip.Addr   // parsed for completeness; unused
	Gateway  netip.Addr   // zero: no default route
	Hostname string
	Device   string // empty: the first non-loopback interface
	DNS      []netip.Addr
	NTP      netip.Addr
}

// ErrAutoconf is what ParseIPParam returns for the autoconfiguration forms
// of ip= (dhcp, on, any, both, bootp, rarp, or a static form with no client
// address): they are not a static configuration. PlanNetwork turns the DHCP
// ones into a DHCP plan.
var ErrAutoconf = errors.New("asks for automatic configuration, not a static address")

// errIPOff marks ip=off / ip=none: the operator asked for no configuration.
var errIPOff = errors.New("ip= disables network configuration")

// ParseIPParam parses the value of an `ip=` kernel parameter (without the
// "ip=" prefix). ip=off and ip=none return ok=false and no error.
func ParseIPParam(value string) (cfg IPConfig, ok bool, err error) {
	cfg, err = parseIP(value)
	if errors.Is(err, errIPOff) {
		return IPConfig{}, false, nil
	}
	if err != nil {
		return IPConfig{}, false, fmt.Errorf("boot: kernel parameter ip=%q: %w", value, err)
	}
	return cfg, true, nil
}

func parseIP(value string) (IPConfig, error) {
	var cfg IPConfig
	switch value {
	case "off", "none":
		return cfg, errIPOff
	case "":
		return cfg, errors.New("empty value")
	case "on", "any", "dhcp", "bootp", "rarp", "both":
		return cfg, ErrAutoconf
	}
	fields := strings.Split(value, ":")
	if len(fields) > 10 {
		return cfg, fmt.Errorf("%d fields, at most 10 are defined (client:server:gw:netmask:hostname:device:autoconf:dns0:dns1:ntp0)", len(fields))
	}
	field := func(i int) string {
		if i < len(fields) {
			return fields[i]
		}
		return ""
	}

	switch autoconf := field(6); autoconf {
	case "", "off", "none":
	case "on", "any", "dhcp", "bootp", "rarp", "both":
		return cfg, fmt.Errorf("autoconf field %q: %w", autoconf, ErrAutoconf)
	default:
		return cfg, fmt.Errorf("autoconf field %q: want off or none", autoconf)
	}

	client, err := parseIPv4("client address", field(0))
	if err != nil {
		return cfg, err
	}
	if !client.IsValid() {
		return cfg, fmt.Errorf("client address (field 1) is empty: %w", ErrAutoconf)
	}
	if cfg.Server, err = parseIPv4("server address", field(1)); err != nil {
		return cfg, err
	}
	if cfg.Gateway, err = parseIPv4("gateway", field(2)); err != nil {
		return cfg, err
	}
	bits, err := parseNetmask(field(3), client)
	if err != nil {
		return cfg, err
	}
	cfg.Client = netip.PrefixFrom(client, bits)
	if cfg.Gateway.IsValid() && !cfg.Client.Masked().Contains(cfg.Gateway) {
		return cfg, fmt.Errorf("gateway %s is not in the client's subnet %s", cfg.Gateway, cfg.Client.Masked())
	}
	if cfg.Hostname, err = parseHostname(field(4)); err != nil {
		return cfg, err
	}
	if cfg.Device, err = parseDevice(field(5)); err != nil {
		return cfg, err
	}
	for i, name := range []string{"dns0", "dns1"} {
		a, err := parseIPv4(name+" address", field(7+i))
		if err != nil {
			return cfg, err
		}
		if a.IsValid() {
			cfg.DNS = append(cfg.DNS, a)
		}
	}
	if cfg.NTP, err = parseIPv4("ntp0 address", field(9)); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// parseIPv4 parses an optional dotted-quad address; empty gives the zero Addr.
func parseIPv4(what, s string) (netip.Addr, error) {
	if s == "" {
		return netip.Addr{}, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() {
		return netip.Addr{}, fmt.Errorf("%s %q is not a dotted-quad IPv4 address", what, s)
	}
	return a, nil
}

// parseNetmask turns a dotted-quad netmask into a prefix length. An empty
// netmask takes the classful default, as the kernel does.
func parseNetmask(s string, client netip.Addr) (int, error) {
	if s == "" {
		switch first := client.As4()[0]; {
		case first < 128:
			return 8, nil
		case first < 192:
			return 16, nil
		default:
			return 24, nil
		}
	}
	m, err := netip.ParseAddr(s)
	if err != nil || !m.Is4() {
		return 0, fmt.Errorf("netmask %q is not a dotted-quad IPv4 netmask", s)
	}
	b := m.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	ones := 0
	for v&(1<<31) != 0 {
		v <<= 1
		ones++
	}
	if v != 0 {
		return 0, fmt.Errorf("netmask %q has non-contiguous bits", s)
	}
	return ones, nil
}

func parseHostname(s string) (string, error) {
	if len(s) > 64 {
		return "", fmt.Errorf("hostname %q is longer than 64 bytes", s)
	}
	for _, r := range s {
		if !(r == '-' || r == '.' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return "", fmt.Errorf("hostname %q: character %q is not allowed (letters, digits, '-' and '.')", s, r)
		}
	}
	return s, nil
}

// parseDevice checks an interface name the way the kernel's dev_valid_name
// does: at most 15 bytes, no '/', no whitespace, not "." or "..".
func parseDevice(s string) (string, error) {
	if s == "" {
		return "", nil
	}
	if len(s) > 15 {
		return "", fmt.Errorf("device %q is longer than 15 bytes", s)
	}
	if s == "." || s == ".." || strings.ContainsAny(s, "/ \t\n\v\f\r") {
		return "", fmt.Errorf("device %q is not a valid interface name", s)
	}
	for _, r := range s {
		if r < 0x21 || r > 0x7e {
			return "", fmt.Errorf("device %q is not a valid interface name", s)
		}
	}
	return s, nil
}

// String formats cfg in the kernel's ip= form (without "ip="); ParseIPParam
// reads it back to the same value.
func (c IPConfig) String() string {
	opt := func(a netip.Addr) string {
		if a.IsValid() {
			return a.String()
		}
		return ""
	}
	var dns [2]string
	for i := 0; i < len(c.DNS) && i < 2; i++ {
		dns[i] = opt(c.DNS[i])
	}
	mask := ""
	if c.Client.IsValid() {
		mask = netmaskString(c.Client.Bits())
	}
	return strings.Join([]string{
		opt(c.Client.Addr()), opt(c.Server), opt(c.Gateway), mask, c.Hostname, c.Device, "off",
		dns[0], dns[1], opt(c.NTP),
	}, ":")
}

func netmaskString(bits int) string {
	v := ^uint32(0) << (32 - bits)
	if bits == 0 {
		v = 0
	}
	return strconv.Itoa(int(v>>24)) + "." + strconv.Itoa(int(v>>16&0xff)) + "." +
		strconv.Itoa(int(v>>8&0xff)) + "." + strconv.Itoa(int(v&0xff))
}

// CmdlineParams splits a kernel command line into parameters. Double quotes
// group a value that contains spaces, as the kernel's own parser allows
// (param="a b"); the quotes are removed.
func CmdlineParams(cmdline string) []string {
	var (
		params []string
		cur    strings.Builder
		quoted bool
		inWord bool
	)
	for _, r := range cmdline {
		switch {
		case r == '"':
			quoted = !quoted
			inWord = true
		case !quoted && (r == ' ' || r == '\t' || r == '\n' || r == '\r' || r == 0):
			if inWord {
				params = append(params, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		params = append(params, cur.String())
	}
	return params
}

// CmdlineValue returns the value of the last `key=value` parameter on the
// command line (the kernel lets a later parameter override an earlier one).
func CmdlineValue(cmdline, key string) (string, bool) {
	var (
		val   string
		found bool
	)
	for _, p := range CmdlineParams(cmdline) {
		if v, ok := strings.CutPrefix(p, key+"="); ok {
			val, found = v, true
		}
	}
	return val, found
}
