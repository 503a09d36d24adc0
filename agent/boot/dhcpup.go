package boot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// dhcpUp carries out a DHCP plan: it picks the interfaces, brings them up,
// waits for a carrier and takes the first DHCPv4 lease. The boot interface
// (BOOTIF) goes first; if it gets no answer the others with a carrier are
// tried. Attempts still running on other interfaces, DHCPv6 and the lease
// renewals carry on in the background until ctx ends.
func dhcpUp(ctx context.Context, nl *rtnl, plan NetPlan, opts NetworkOptions) (string, error) {
	start := opts.Clock.Now()
	lctx, cancel := context.WithTimeout(ctx, DefaultLinkTimeout)
	defer cancel()

	first := plan.Device
	if first == "" && plan.BootMAC != nil {
		name, err := waitFor(lctx, "the boot interface "+plan.BootMAC.String(), func() (string, error) { return interfaceByMAC(plan.BootMAC) })
		if err != nil {
			opts.Logf("boot: BOOTIF: %v; trying every interface", err)
		}
		first = name
	}
	var names []string
	if plan.Device != "" {
		if _, err := waitFor(lctx, "device "+plan.Device, func() (*net.Interface, error) { return net.InterfaceByName(plan.Device) }); err != nil {
			return "", fmt.Errorf("boot: network (%s): %w", plan, err)
		}
		names = []string{plan.Device}
	} else {
		all, err := waitFor(lctx, "a network device", nonLoopback)
		if err != nil {
			return "", fmt.Errorf("boot: network (%s): %w", plan, err)
		}
		names = all
	}
	for _, n := range names {
		ifi, err := net.InterfaceByName(n)
		if err != nil {
			return "", fmt.Errorf("boot: network: %w", err)
		}
		if err := nl.linkUp(ifi.Index); err != nil {
			return "", fmt.Errorf("boot: network: set %s up: %w", n, err)
		}
	}

	var tries [][]string
	if first != "" {
		if _, err := waitFor(lctx, "carrier on "+first, func() (bool, error) { return hasCarrier(first) }); err != nil {
			if plan.Device != "" {
				return "", fmt.Errorf("boot: network (%s): %w", plan, err)
			}
			opts.Logf("boot: boot interface %s: %v; trying the others", first, err)
		} else {
			tries = append(tries, []string{first})
		}
	}
	if plan.Device == "" {
		// With the boot interface ready, the others are a fallback: take
		// those that have a carrier now rather than wait for more.
		others, err := withCarrier(names, first)
		if len(tries) == 0 {
			others, err = waitFor(lctx, "carrier on any interface", func() ([]string, error) { return withCarrier(names, first) })
			if err != nil {
				return "", fmt.Errorf("boot: network (%s): %w", plan, err)
			}
		}
		if len(others) > 0 {
			tries = append(tries, others)
		}
	}

	var errs []error
	for _, group := range tries {
		ifname, ack, err := firstLease(ctx, group, opts)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		mac := hwAddr(ifname)
		d := opts.Clock.Now().Sub(start).Round(time.Millisecond)
		go dhcp6(ctx, ifname, opts)
		return fmt.Sprintf("%s (%s; DHCP took %s)", describeLease(ifname, mac, ack), plan, d), nil
	}
	return "", fmt.Errorf("boot: network (%s): %w", plan, errors.Join(errs...))
}

// firstLease asks every interface of group at once and returns the first
// lease, applied; the other attempts finish in the background and are
// applied when they succeed.
func firstLease(ctx context.Context, group []string, opts NetworkOptions) (string, *dhcpv4.DHCPv4, error) {
	type result struct {
		ifname string
		ack    *dhcpv4.DHCPv4
		err    error
	}
	results := make(chan result, len(group))
	for _, n := range group {
		go func() {
			ack, err := opts.DHCP.Lease4(ctx, n)
			if err == nil {
				err = opts.DHCP.Apply4(n, ack)
			}
			if err != nil {
				err = fmt.Errorf("%s: %w", n, err)
			}
			results <- result{n, ack, err}
		}()
	}
	keep := func(r result) {
		obtained := opts.Clock.Now()
		if err := saveLease(opts.LeaseDir, r.ifname, r.ack, obtained); err != nil {
			opts.Logf("boot: %v (the lease is not renewed after the root switch)", err)
		}
		k := &leaseKeeper{dhcp: opts.DHCP, clock: opts.Clock, after: opts.After, dir: opts.LeaseDir, logf: opts.Logf}
		go k.keep(ctx, r.ifname, r.ack, obtained)
	}
	var errs []error
	for i := range group {
		r := <-results
		if r.err != nil {
			errs = append(errs, r.err)
			continue
		}
		keep(r)
		if rest := len(group) - i - 1; rest > 0 {
			go func() {
				for range rest {
					if r := <-results; r.err == nil {
						opts.Logf("boot: also %s", describeLease(r.ifname, hwAddr(r.ifname), r.ack))
						keep(r)
					}
				}
			}()
		}
		return r.ifname, r.ack, nil
	}
	return "", nil, errors.Join(errs...)
}

// dhcp6 tries DHCPv6 once and says what came of it.
func dhcp6(ctx context.Context, ifname string, opts NetworkOptions) {
	got, err := opts.DHCP.Lease6(ctx, ifname)
	switch {
	case ctx.Err() != nil:
	case err != nil:
		opts.Logf("boot: no DHCPv6 lease on %s (%v); IPv6 comes from router advertisements, if any", ifname, err)
	default:
		opts.Logf("boot: DHCPv6 on %s: %s", ifname, got)
	}
}

func interfaceByMAC(mac net.HardwareAddr) (string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	for _, i := range ifs {
		if bytes.Equal(i.HardwareAddr, mac) {
			return i.Name, nil
		}
	}
	return "", errNotYet
}

func nonLoopback() ([]string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, i := range ifs {
		if i.Flags&net.FlagLoopback == 0 {
			names = append(names, i.Name)
		}
	}
	if len(names) == 0 {
		return nil, errNotYet
	}
	sort.Strings(names)
	return names, nil
}

// withCarrier lists the interfaces of names, except skip, that have a
// carrier; none is errNotYet.
func withCarrier(names []string, skip string) ([]string, error) {
	var out []string
	for _, n := range names {
		if n == skip {
			continue
		}
		if ok, _ := hasCarrier(n); ok {
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: none of %s", errNotYet, strings.Join(names, ", "))
	}
	return out, nil
}

func hwAddr(ifname string) net.HardwareAddr {
	if i, err := net.InterfaceByName(ifname); err == nil {
		return i.HardwareAddr
	}
	return nil
}
