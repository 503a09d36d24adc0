package boot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/u-root/u-root/pkg/dhclient"
	"github.com/vishvananda/netlink"

	"github.com/tetherfleet/tether/internal/clock"
)

// DHCP is the seam to the DHCP client. The real one (UrootDHCP) wraps
// u-root's dhclient and insomniacslk's nclient4; tests use a fake.
type DHCP interface {
	// Lease4 runs a full DHCPv4 exchange on the interface (already up).
	Lease4(ctx context.Context, ifname string) (*dhcpv4.DHCPv4, error)
	// Renew4 renews the lease in ack with the server that gave it.
	Renew4(ctx context.Context, ifname string, ack *dhcpv4.DHCPv4) (*dhcpv4.DHCPv4, error)
	// Apply4 configures the address, the routes and /etc/resolv.conf.
	Apply4(ifname string, ack *dhcpv4.DHCPv4) error
	// Lease6 gets and applies a DHCPv6 address; it describes what it got.
	Lease6(ctx context.Context, ifname string) (string, error)
}

// DefaultLeaseDir is where leases are kept so that the agent which runs
// after the root switch (/run moves along) renews them.
const DefaultLeaseDir = "/run/tether/dhcp"

// agentVendorClass is the DHCP option 60 the agent sends: a DHCP server
// can tell the booted node's agent from the firmware (PXEClient) by it.
const agentVendorClass = "tether-agent"

// UrootDHCP is the real DHCP client.
type UrootDHCP struct {
	// Timeout bounds one attempt, Retries how many follow it.
	Timeout time.Duration
	Retries int
}

func (u UrootDHCP) config() dhclient.Config {
	c := dhclient.Config{Timeout: u.Timeout, Retries: u.Retries, LogLevel: dhclient.LogInfo,
		Modifiers4: []dhcpv4.Modifier{dhcpv4.WithOption(dhcpv4.OptClassIdentifier(agentVendorClass))}}
	if c.Timeout == 0 {
		c.Timeout = 3 * time.Second
	}
	if c.Retries == 0 {
		c.Retries = 4
	}
	return c
}

// Lease4 implements DHCP. It talks to nclient4 directly rather than
// through u-root's dhclient, whose IfUp first waits for the link's
// operstate to read up: the kernel's linkwatch reports that up to a second
// after the carrier (it batches non-urgent events a second apart), while
// the device sends as soon as it is up with a carrier, which dhcpUp has
// already waited for. That wait was most of the DHCP phase of every
// netboot (issue 30: ~1 s of ~1.2 s).
func (u UrootDHCP) Lease4(ctx context.Context, ifname string) (*dhcpv4.DHCPv4, error) {
	c := u.config()
	client, err := nclient4.New(ifname, nclient4.WithTimeout(c.Timeout), nclient4.WithRetry(c.Retries))
	if err != nil {
		return nil, fmt.Errorf("DHCP client on %s: %w", ifname, err)
	}
	defer client.Close()
	// What dhclient asks for, with the agent's vendor class in place of
	// u-root's.
	mods := append([]dhcpv4.Modifier{dhcpv4.WithRequestedOptions(dhcpv4.OptionSubnetMask), dhcpv4.WithNetboot}, c.Modifiers4...)
	l, err := client.Request(ctx, mods...)
	if err != nil {
		return nil, fmt.Errorf("no DHCPv4 answer on %s: %w", ifname, err)
	}
	return l.ACK, nil
}

// Renew4 implements DHCP.
func (u UrootDHCP) Renew4(ctx context.Context, ifname string, ack *dhcpv4.DHCPv4) (*dhcpv4.DHCPv4, error) {
	c := u.config()
	client, err := nclient4.New(ifname, nclient4.WithTimeout(c.Timeout), nclient4.WithRetry(c.Retries))
	if err != nil {
		return nil, fmt.Errorf("DHCP client on %s: %w", ifname, err)
	}
	defer client.Close()
	// Renew matches the answer against the offer's server identifier,
	// which the ACK carries too.
	l, err := client.Renew(ctx, &nclient4.Lease{Offer: ack, ACK: ack}, c.Modifiers4...)
	if err != nil {
		return nil, err
	}
	return l.ACK, nil
}

// Apply4 implements DHCP.
func (UrootDHCP) Apply4(ifname string, ack *dhcpv4.DHCPv4) error {
	link, err := netlink.LinkByName(ifname)
	if err != nil {
		return fmt.Errorf("find %s: %w", ifname, err)
	}
	return dhclient.Configure4(link, ack)
}

// Lease6 implements DHCP.
func (u UrootDHCP) Lease6(ctx context.Context, ifname string) (string, error) {
	link, err := netlink.LinkByName(ifname)
	if err != nil {
		return "", fmt.Errorf("find %s: %w", ifname, err)
	}
	for r := range dhclient.SendRequests(ctx, []netlink.Link{link}, false, true, u.config(), DefaultLinkTimeout) {
		if r.Err != nil {
			return "", r.Err
		}
		if err := r.Lease.Configure(); err != nil {
			return "", err
		}
		return r.Lease.String(), nil
	}
	return "", errors.New("no DHCPv6 answer")
}

// describeLease is the console's one-line summary of a DHCPv4 lease.
func describeLease(ifname string, mac net.HardwareAddr, ack *dhcpv4.DHCPv4) string {
	ones, _ := ack.SubnetMask().Size()
	if ack.SubnetMask() == nil {
		ones = 32
	}
	parts := []string{fmt.Sprintf("DHCP on %s (%s): %s/%d", ifname, mac, ack.YourIPAddr, ones)}
	if r := ack.Router(); len(r) > 0 {
		parts = append(parts, "router "+joinIPs(r))
	}
	if d := ack.DNS(); len(d) > 0 {
		parts = append(parts, "dns "+joinIPs(d))
	}
	if s := ack.ServerIdentifier(); s != nil {
		parts = append(parts, "server "+s.String())
	}
	if l := ack.IPAddressLeaseTime(0); l > 0 {
		parts = append(parts, "lease "+l.String())
	}
	return strings.Join(parts, ", ")
}

func joinIPs(ips []net.IP) string {
	s := make([]string, len(ips))
	for i, ip := range ips {
		s[i] = ip.String()
	}
	return strings.Join(s, " ")
}

// savedLease is a lease as kept on disk for the agent after the switch.
type savedLease struct {
	Interface string    `json:"interface"`
	Obtained  time.Time `json:"obtained"`
	ACK       []byte    `json:"ack"`
}

func saveLease(dir, ifname string, ack *dhcpv4.DHCPv4, obtained time.Time) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("save DHCP lease: %w", err)
	}
	b, err := json.Marshal(savedLease{Interface: ifname, Obtained: obtained, ACK: ack.ToBytes()})
	if err != nil {
		return fmt.Errorf("save DHCP lease: %w", err)
	}
	path := filepath.Join(dir, ifname+".dhcp4")
	if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
		return fmt.Errorf("save DHCP lease: %w", err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		return fmt.Errorf("save DHCP lease: %w", err)
	}
	return nil
}

func loadLeases(dir string) ([]savedLease, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.dhcp4"))
	if err != nil {
		return nil, err
	}
	var out []savedLease
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("read DHCP lease: %w", err)
		}
		var l savedLease
		if err := json.Unmarshal(b, &l); err != nil {
			return nil, fmt.Errorf("DHCP lease %s: %w", p, err)
		}
		out = append(out, l)
	}
	return out, nil
}

// leaseKeeper renews DHCPv4 leases while the node runs (RFC 2131 4.4.5):
// a renewal with the lease's server at T1, retried at half the remaining
// time (at least a minute) until the lease expires, then a fresh DHCP
// exchange with any server.
type leaseKeeper struct {
	dhcp  DHCP
	clock clock.Clock
	after func(time.Duration) <-chan time.Time
	dir   string
	logf  func(string, ...any)
}

// minRetry keeps a failing renewal from hammering the server.
const minRetry = time.Minute

// renewAt is T1 of a lease obtained at obtained; ok is false for a lease
// that never needs renewing (no or infinite lease time).
func renewAt(ack *dhcpv4.DHCPv4, obtained time.Time) (t1, expiry time.Time, ok bool) {
	lease := ack.IPAddressLeaseTime(0)
	if lease <= 0 || lease == time.Duration(0xffffffff)*time.Second {
		return time.Time{}, time.Time{}, false
	}
	return obtained.Add(ack.IPAddressRenewalTime(lease / 2)), obtained.Add(lease), true
}

// keep runs until ctx ends or the lease needs no renewal.
func (k *leaseKeeper) keep(ctx context.Context, ifname string, ack *dhcpv4.DHCPv4, obtained time.Time) {
	t1, expiry, ok := renewAt(ack, obtained)
	if !ok {
		return
	}
	next := t1
	for {
		select {
		case <-ctx.Done():
			return
		case <-k.after(next.Sub(k.clock.Now())):
		}
		now := k.clock.Now()
		var (
			fresh *dhcpv4.DHCPv4
			err   error
		)
		if now.Before(expiry) {
			fresh, err = k.dhcp.Renew4(ctx, ifname, ack)
		} else {
			fresh, err = k.dhcp.Lease4(ctx, ifname)
		}
		if err == nil {
			if !fresh.YourIPAddr.Equal(ack.YourIPAddr) {
				k.logf("boot: DHCP on %s: address changed from %s to %s", ifname, ack.YourIPAddr, fresh.YourIPAddr)
			}
			err = k.dhcp.Apply4(ifname, fresh)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			now = k.clock.Now()
			if now.Before(expiry) {
				next = now.Add(max(expiry.Sub(now)/2, minRetry))
				k.logf("boot: DHCP renewal on %s failed (retrying in %s, lease ends %s): %v", ifname, next.Sub(now).Round(time.Second), expiry.Format(time.RFC3339), err)
			} else {
				next = now.Add(minRetry)
				k.logf("boot: DHCP lease on %s expired and no server answered (retrying in %s): %v", ifname, minRetry, err)
			}
			continue
		}
		ack, obtained = fresh, k.clock.Now()
		if err := saveLease(k.dir, ifname, ack, obtained); err != nil {
			k.logf("boot: %v", err)
		}
		if t1, expiry, ok = renewAt(ack, obtained); !ok {
			return
		}
		next = t1
	}
}

// KeepLeases renews the DHCP leases saved in dir (by the agent that set
// the network up before the root switch) until ctx ends. A dir that does
// not exist means there is nothing to renew.
func KeepLeases(ctx context.Context, dir string, logf func(string, ...any)) error {
	leases, err := loadLeases(dir)
	if errors.Is(err, fs.ErrNotExist) || len(leases) == 0 {
		return err
	}
	if err != nil {
		return err
	}
	k := &leaseKeeper{dhcp: UrootDHCP{}, clock: clock.Real{}, after: time.After, dir: dir, logf: logf}
	done := make(chan struct{}, len(leases))
	for _, l := range leases {
		ack, err := dhcpv4.FromBytes(l.ACK)
		if err != nil {
			return fmt.Errorf("DHCP lease of %s: %w", l.Interface, err)
		}
		go func() { k.keep(ctx, l.Interface, ack, l.Obtained); done <- struct{}{} }()
	}
	for range leases {
		<-done
	}
	return nil
}
