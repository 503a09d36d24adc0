package boot

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherfleet/tether/internal/clock"
)

// DefaultLinkTimeout bounds the wait for a device to appear and for its
// carrier. Under QEMU virtio-net reports carrier as soon as the link is up;
// on hardware autonegotiation takes a few seconds.
const DefaultLinkTimeout = 15 * time.Second

// NetworkOptions are ConfigureNetwork's seams; every field has a usable
// zero value.
type NetworkOptions struct {
	DHCP     DHCP   // default UrootDHCP{}
	LeaseDir string // default DefaultLeaseDir
	Logf     func(format string, args ...any)
	Clock    clock.Clock                          // default the wall clock
	After    func(time.Duration) <-chan time.Time // default time.After
}

func (o *NetworkOptions) defaults() {
	if o.DHCP == nil {
		o.DHCP = UrootDHCP{}
	}
	if o.LeaseDir == "" {
		o.LeaseDir = DefaultLeaseDir
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.After == nil {
		o.After = time.After
	}
}

// ConfigureNetwork brings up lo and then the network the kernel command
// line asks for (see PlanNetwork): a static ip=, or DHCP, waiting (bounded
// by ctx and DefaultLinkTimeout) for the link's carrier. It returns one
// line that says what it did. DHCP leases are renewed in the background
// until ctx ends, and DHCPv6 is tried beside DHCPv4 (SLAAC is the
// kernel's, once the link is up).
func ConfigureNetwork(ctx context.Context, cmdline string, opts NetworkOptions) (summary string, err error) {
	opts.defaults()
	plan, err := PlanNetwork(cmdline)
	if err != nil {
		return "", err
	}
	nl, err := dialRtnl()
	if err != nil {
		return "", fmt.Errorf("boot: network: %w", err)
	}
	defer nl.Close()

	if err := bringUp(nl, "lo"); err != nil {
		return "", fmt.Errorf("boot: network: %w", err)
	}
	switch plan.Kind {
	case NetNone:
		return plan.String(), nil
	case NetStatic:
		if err := applyIPConfig(ctx, nl, plan.Static); err != nil {
			return "", err
		}
		return fmt.Sprintf("static %s on %s", plan.Static.Client, deviceName(plan.Static.Device)), nil
	}
	summary, err = dhcpUp(ctx, nl, plan, opts)
	if err != nil && plan.Implicit {
		// Nothing asked for a network; say why there is none and go on.
		return fmt.Sprintf("only lo is up: %s found no DHCP server (%v)", plan, err), nil
	}
	return summary, err
}

func deviceName(dev string) string {
	if dev == "" {
		return "the first interface"
	}
	return dev
}

// ApplyIPConfig configures one interface from cfg (see ConfigureNetwork).
func ApplyIPConfig(ctx context.Context, cfg IPConfig) error {
	nl, err := dialRtnl()
	if err != nil {
		return fmt.Errorf("boot: network: %w", err)
	}
	defer nl.Close()
	return applyIPConfig(ctx, nl, cfg)
}

func applyIPConfig(ctx context.Context, nl *rtnl, cfg IPConfig) error {
	if err := configure(ctx, nl, cfg); err != nil {
		return fmt.Errorf("boot: network (ip=%s): %w", cfg, err)
	}
	return nil
}

func configure(ctx context.Context, nl *rtnl, cfg IPConfig) error {
	ctx, cancel := context.WithTimeout(ctx, DefaultLinkTimeout)
	defer cancel()

	dev := cfg.Device
	if dev == "" {
		// Like the kernel's ipconfig: take the first device that is not
		// loopback. Wait for one, since the driver may still be probing.
		var err error
		if dev, err = waitFor(ctx, "a network device", firstNonLoopback); err != nil {
			return err
		}
	}
	ifi, err := waitFor(ctx, "device "+dev, func() (*net.Interface, error) { return net.InterfaceByName(dev) })
	if err != nil {
		return err
	}
	if err := nl.linkUp(ifi.Index); err != nil {
		return fmt.Errorf("set %s up: %w", dev, err)
	}
	if err := nl.addAddr(ifi.Index, cfg.Client); err != nil {
		return fmt.Errorf("add address %s to %s: %w", cfg.Client, dev, err)
	}
	if _, err := waitFor(ctx, "carrier on "+dev, func() (bool, error) { return hasCarrier(dev) }); err != nil {
		return err
	}
	if cfg.Gateway.IsValid() {
		if err := nl.replaceDefaultRoute(ifi.Index, cfg.Gateway); err != nil {
			return fmt.Errorf("default route via %s: %w", cfg.Gateway, err)
		}
	}
	if cfg.Hostname != "" {
		if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
			return fmt.Errorf("set hostname %q: %w", cfg.Hostname, err)
		}
	}
	if len(cfg.DNS) > 0 {
		if err := writeResolvConf("/etc/resolv.conf", cfg); err != nil {
			return err
		}
	}
	return nil
}

// hasCarrier reads the driver's carrier state from sysfs. IFF_RUNNING would
// do without sysfs, but it follows the operational state, which the
// kernel's linkwatch updates up to a second late (it batches link events);
// the carrier itself is what decides whether frames go out, and that is
// what sysfs shows.
func hasCarrier(dev string) (bool, error) {
	b, err := os.ReadFile(filepath.Join("/sys/class/net", dev, "carrier"))
	switch {
	case err == nil:
		if strings.TrimSpace(string(b)) == "1" {
			return true, nil
		}
		return false, errNotYet
	case errors.Is(err, fs.ErrNotExist):
		// No sysfs, or one mounted for another network namespace.
		i, err := net.InterfaceByName(dev)
		if err != nil {
			return false, err
		}
		if i.Flags&net.FlagRunning == 0 {
			return false, errNotYet
		}
		return true, nil
	default:
		// EINVAL while the device is still coming up.
		return false, fmt.Errorf("%w: %v", errNotYet, err)
	}
}

func bringUp(nl *rtnl, name string) error {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return fmt.Errorf("find %s: %w", name, err)
	}
	if err := nl.linkUp(ifi.Index); err != nil {
		return fmt.Errorf("set %s up: %w", name, err)
	}
	return nil
}

func firstNonLoopback() (string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	var names []string
	for _, i := range ifs {
		if i.Flags&net.FlagLoopback == 0 {
			names = append(names, i.Name)
		}
	}
	if len(names) == 0 {
		return "", errNotYet
	}
	sort.Strings(names) // stable choice: eth0 before eth1
	return names[0], nil
}

func writeResolvConf(path string, cfg IPConfig) error {
	var b strings.Builder
	for _, a := range cfg.DNS {
		fmt.Fprintf(&b, "nameserver %s\n", a)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// errNotYet tells waitFor to poll again.
var errNotYet = fmt.Errorf("not yet")

// waitFor polls f until it succeeds or ctx ends. Polling (every 10 ms) is
// simpler than a netlink subscription and costs nothing measurable here.
func waitFor[T any](ctx context.Context, what string, f func() (T, error)) (T, error) {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	var last error
	for {
		v, err := f()
		if err == nil {
			return v, nil
		}
		last = err
		select {
		case <-ctx.Done():
			var zero T
			return zero, fmt.Errorf("waiting for %s: %w (last: %v)", what, ctx.Err(), last)
		case <-t.C:
		}
	}
}
