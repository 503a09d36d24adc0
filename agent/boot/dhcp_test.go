package boot

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"

	"github.com/tetherfleet/tether/internal/clock"
)

func ack(t *testing.T, ip string, lease time.Duration) *dhcpv4.DHCPv4 {
	t.Helper()
	m, err := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeAck), dhcpv4.WithYourIP(net.ParseIP(ip)),
		dhcpv4.WithNetmask(net.CIDRMask(24, 32)), dhcpv4.WithLeaseTime(uint32(lease/time.Second)),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.ParseIP("10.0.9.1"))))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// fakeDHCP answers renewals and fresh requests from scripted results.
type fakeDHCP struct {
	calls   chan string // "renew", "lease", "apply <ip>"
	renew   []error
	lease   []error
	renewTo *dhcpv4.DHCPv4
}

func (f *fakeDHCP) Lease4(ctx context.Context, ifname string) (*dhcpv4.DHCPv4, error) {
	f.calls <- "lease"
	err := f.lease[0]
	f.lease = f.lease[1:]
	return f.renewTo, err
}

func (f *fakeDHCP) Renew4(ctx context.Context, ifname string, a *dhcpv4.DHCPv4) (*dhcpv4.DHCPv4, error) {
	f.calls <- "renew"
	err := f.renew[0]
	f.renew = f.renew[1:]
	return f.renewTo, err
}

func (f *fakeDHCP) Apply4(ifname string, a *dhcpv4.DHCPv4) error {
	f.calls <- "apply " + a.YourIPAddr.String()
	return nil
}

func (f *fakeDHCP) Lease6(ctx context.Context, ifname string) (string, error) {
	return "", errors.New("no DHCPv6 here")
}

// TestLeaseKeeper drives the renewal loop with a fake clock: renew at T1,
// retry at half the remaining time after a failure, a fresh exchange once
// the lease has expired, and the new lease's T1 after a success.
func TestLeaseKeeper(t *testing.T) {
	start := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	clk := clock.NewFake(start)
	waits := make(chan time.Duration)
	fire := make(chan time.Time)
	after := func(d time.Duration) <-chan time.Time { waits <- d; return fire }
	fresh := ack(t, "10.0.9.51", time.Hour)
	f := &fakeDHCP{
		calls:   make(chan string, 16),
		renew:   []error{errors.New("server down"), errors.New("server down"), errors.New("server down")},
		lease:   []error{nil},
		renewTo: fresh,
	}
	var logs []string
	k := &leaseKeeper{dhcp: f, clock: clk, after: after, dir: t.TempDir(), logf: func(format string, a ...any) { logs = append(logs, format) }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { k.keep(ctx, "eth0", ack(t, "10.0.9.50", time.Hour), start); close(done) }()

	step := func(wantWait time.Duration, advance time.Duration, wantCalls ...string) {
		t.Helper()
		if got := <-waits; got != wantWait {
			t.Fatalf("waits %s, want %s", got, wantWait)
		}
		clk.Advance(advance)
		fire <- clk.Now()
		for _, want := range wantCalls {
			if got := <-f.calls; got != want {
				t.Fatalf("call %q, want %q", got, want)
			}
		}
	}
	step(30*time.Minute, 30*time.Minute, "renew")                                  // T1 = half the lease
	step(15*time.Minute, 15*time.Minute, "renew")                                  // half of the 30 min left
	step(7*time.Minute+30*time.Second, 15*time.Minute, "lease", "apply 10.0.9.51") // past expiry: a fresh exchange
	if got := <-waits; got != 30*time.Minute {                                     // the new lease's T1
		t.Fatalf("after a fresh lease, waits %s; want 30m", got)
	}
	cancel()
	<-done
	if len(f.renew) != 1 {
		t.Errorf("renewals left %d, want 1 (two used)", len(f.renew))
	}
	saved, err := loadLeases(k.dir)
	if err != nil || len(saved) != 1 || !saved[0].Obtained.Equal(start.Add(time.Hour)) {
		t.Fatalf("saved %+v, %v; want the fresh lease obtained at %s", saved, err, start.Add(time.Hour))
	}
}

func TestRenewAt(t *testing.T) {
	start := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	t1, exp, ok := renewAt(ack(t, "10.0.9.50", 2*time.Hour), start)
	if !ok || !t1.Equal(start.Add(time.Hour)) || !exp.Equal(start.Add(2*time.Hour)) {
		t.Errorf("2h lease: %v %v %v", t1, exp, ok)
	}
	infinite := ack(t, "10.0.9.50", 0)
	infinite.UpdateOption(dhcpv4.OptIPAddressLeaseTime(time.Duration(0xffffffff) * time.Second))
	if _, _, ok := renewAt(infinite, start); ok {
		t.Error("an infinite lease must not be renewed")
	}
	none, _ := dhcpv4.New()
	if _, _, ok := renewAt(none, start); ok {
		t.Error("a lease without a lease time must not be renewed")
	}
}
