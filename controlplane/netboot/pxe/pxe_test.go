package pxe

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/insomniacslk/dhcp/iana"
	"github.com/mdlayher/ndp"
	"pack.ag/tftp"

	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/testkit/netnstest"
)

func TestCheckFlags(t *testing.T) {
	tests := []struct {
		name string
		o    Options
		want string // "" = accepted
	}{
		{"off", Options{}, ""},
		{"proxy", Options{Interface: "br0", Mode: "proxy"}, ""},
		{"no mode", Options{Interface: "br0"}, "needs --dhcp-mode"},
		{"range without interface", Options{Range: "10.0.0.5-10.0.0.9"}, "--dhcp-range need --dhcp-interface"},
		{"mode without interface", Options{Mode: "full"}, "--dhcp-mode need --dhcp-interface"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.o.CheckFlags()
			if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("CheckFlags = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestConfigRefusesBadCombinations(t *testing.T) {
	ns := netnstest.New(t, "10.213.0.1/24")
	tests := []struct {
		name string
		o    Options
		want string
	}{
		{"unknown interface", Options{Interface: "nosuch0", Mode: "proxy"}, "nosuch0"},
		{"bad mode", Options{Interface: ns.Server, Mode: "relay"}, "want proxy or full"},
		{"proxy with range", Options{Interface: ns.Server, Mode: "proxy", Range: "10.213.0.10-10.213.0.20"}, "need --dhcp-mode full"},
		{"full without range", Options{Interface: ns.Server, Mode: "full"}, "FIRST-LAST"},
		{"range syntax", Options{Interface: ns.Server, Mode: "full", Range: "10.213.0.10"}, "want FIRST-LAST"},
		{"range off the subnet", Options{Interface: ns.Server, Mode: "full", Range: "10.9.0.10-10.9.0.20"}, "not in the interface's subnet"},
		{"router not IPv4", Options{Interface: ns.Server, Mode: "full", Range: "10.213.0.10-10.213.0.20", Router: "fe80::1"}, "--dhcp-router"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if derr := ns.Do(func() error { _, err = tc.o.Config("http://10.213.0.1:8080"); return nil }); derr != nil {
				t.Fatal(derr)
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Config = %v, want an error about %q", err, tc.want)
			}
		})
	}
}

// TestServiceInANamespace runs the whole service (full mode) on one end of
// a veth pair and, from the other end, leases an address, fetches the BIOS
// loader over TFTP and hears a router advertisement.
func TestServiceInANamespace(t *testing.T) {
	ns := netnstest.New(t, "10.213.0.1/24")
	for _, name := range []string{ns.Name, ns.ClientName} {
		// Link-local addresses usable at once, without duplicate detection.
		if out, err := exec.Command("ip", "netns", "exec", name, "sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0").CombinedOutput(); err != nil {
			t.Skipf("SKIP: cannot turn off IPv6 duplicate address detection in the namespace (%v: %s)", err, out)
		}
	}
	// Re-create link-local addresses under the new setting.
	for _, c := range [][]string{{"-n", ns.Name, "link", "set", ns.Server, "down"}, {"-n", ns.Name, "link", "set", ns.Server, "up"},
		{"-n", ns.ClientName, "link", "set", ns.Client, "down"}, {"-n", ns.ClientName, "link", "set", ns.Client, "up"}} {
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v %s", c, err, out)
		}
	}
	// Wait for the server end's link-local address: the service opens its
	// router-advertisement socket on it once, at start.
	for deadline := time.Now().Add(10 * time.Second); ; {
		out, _ := exec.Command("ip", "-n", ns.Name, "-6", "addr", "show", "dev", ns.Server, "scope", "link").CombinedOutput()
		if strings.Contains(string(out), "fe80") && !strings.Contains(string(out), "tentative") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no IPv6 link-local address on %s: %s", ns.Server, out)
		}
		runtime.Gosched()
	}
	dir := t.TempDir()
	loader := bytes.Repeat([]byte("kpxe"), 2000)
	if err := os.WriteFile(filepath.Join(dir, "undionly.kpxe"), loader, 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "t.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	o := Options{Interface: ns.Server, Mode: "full", Range: "10.213.0.100-10.213.0.110", Router: "10.213.0.1", IPXEDir: dir}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ns.Go(func() {
		cfg, err := o.Config("http://10.213.0.1:8080")
		if err != nil {
			done <- err
			return
		}
		svc := &Service{Options: o, Config: cfg, Store: st, Clock: clock.Real{}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		done <- svc.Run(ctx)
	})
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	tctx, tcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer tcancel()
	var lease *nclient4.Lease
	var ra *ndp.RouterAdvertisement
	var got []byte
	err = ns.DoClient(func() error {
		// The router advertisement first: the service sends one as soon
		// as it leads.
		ifi, err := net.InterfaceByName(ns.Client)
		if err != nil {
			return err
		}
		var rc *ndp.Conn
		for {
			if rc, _, err = ndp.Listen(ifi, ndp.LinkLocal); err == nil || tctx.Err() != nil {
				break
			}
		}
		if err != nil {
			return err
		}
		defer rc.Close()
		_ = rc.WriteTo(&ndp.RouterSolicitation{}, nil, netip.MustParseAddr("ff02::2"))
		_ = rc.SetReadDeadline(time.Now().Add(15 * time.Second))
		for ra == nil {
			m, _, _, err := rc.ReadFrom()
			if err != nil {
				return err
			}
			ra, _ = m.(*ndp.RouterAdvertisement)
		}

		c, err := nclient4.New(ns.Client, nclient4.WithTimeout(2*time.Second), nclient4.WithRetry(5))
		if err != nil {
			return err
		}
		defer c.Close()
		lease, err = c.Request(tctx, dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient:Arch:00000:UNDI:002001")),
			dhcpv4.WithOption(dhcpv4.OptClientArch(iana.INTEL_X86PC)))
		if err != nil {
			return err
		}
		if out, err := exec.Command("ip", "addr", "add", lease.ACK.YourIPAddr.String()+"/24", "dev", ns.Client).CombinedOutput(); err != nil {
			return &os.PathError{Op: "ip addr add", Path: string(out), Err: err}
		}
		tc, err := tftp.NewClient(tftp.ClientTimeout(2))
		if err != nil {
			return err
		}
		resp, err := tc.Get("tftp://" + lease.ACK.ServerIPAddr.String() + "/" + lease.ACK.BootFileName)
		if err != nil {
			return err
		}
		got, err = io.ReadAll(resp)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if !lease.ACK.YourIPAddr.Equal(net.ParseIP("10.213.0.100")) || lease.ACK.BootFileName != "undionly.kpxe" {
		t.Fatalf("lease: %s", lease.ACK.Summary())
	}
	if !bytes.Equal(got, loader) {
		t.Fatalf("TFTP loader: %d bytes, want %d", len(got), len(loader))
	}
	if ra.RouterLifetime != 0 || ra.ManagedConfiguration || ra.OtherConfiguration {
		t.Fatalf("router advertisement %+v: want no default route and no DHCPv6", ra)
	}
	// The lease is in the store: a restart keeps it.
	if l, err := st.GetDHCPLeaseByMAC(context.Background(), lease.ACK.ClientHWAddr.String()); err != nil || l.IP != "10.213.0.100" {
		t.Fatalf("stored lease: %+v %v", l, err)
	}
}

// TestRouterAdvertisementsWaitForTheLinkLocal: the service starts while
// its interface has no carrier (the far end down, as a bridge whose tap
// QEMU has not opened yet), so its IPv6 link-local address is still
// tentative. Once the link comes up, a solicitation is answered all the
// same. Before, the service gave up on advertisements at start, and every
// full-mode boot waited out iPXE's IPv6 autoconfiguration.
func TestRouterAdvertisementsWaitForTheLinkLocal(t *testing.T) {
	ns := netnstest.New(t, "10.213.1.1/24")
	if out, err := exec.Command("ip", "-n", ns.ClientName, "link", "set", ns.Client, "down").CombinedOutput(); err != nil {
		t.Fatalf("take the client end down: %v %s", err, out)
	}
	out, _ := exec.Command("ip", "-n", ns.Name, "-6", "addr", "show", "dev", ns.Server, "scope", "link").CombinedOutput()
	if strings.Contains(string(out), "fe80") && !strings.Contains(string(out), "tentative") {
		t.Skipf("SKIP: the server end's link-local address is usable without a carrier here (%s); nothing to test", out)
	}
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "t.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "undionly.kpxe"), []byte("kpxe"), 0o644); err != nil {
		t.Fatal(err)
	}
	logs := &strings.Builder{}
	var mu = make(chan struct{}, 1)
	mu <- struct{}{}
	o := Options{Interface: ns.Server, Mode: "full", Range: "10.213.1.100-10.213.1.110", Router: "10.213.1.1", IPXEDir: dir}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ns.Go(func() {
		cfg, err := o.Config("http://10.213.1.1:8080")
		if err != nil {
			done <- err
			return
		}
		h := slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
			<-mu
			defer func() { mu <- struct{}{} }()
			return logs.Write(p)
		}), nil)
		svc := &Service{Options: o, Config: cfg, Store: st, Clock: clock.Real{}, Log: slog.New(h)}
		done <- svc.Run(ctx)
	})
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	if out, err := exec.Command("ip", "-n", ns.ClientName, "link", "set", ns.Client, "up").CombinedOutput(); err != nil {
		t.Fatalf("bring the client end up: %v %s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	var ra *ndp.RouterAdvertisement
	err = ns.DoClient(func() error {
		ifi, err := net.InterfaceByName(ns.Client)
		if err != nil {
			return err
		}
		// The client's own link-local address passes duplicate detection
		// first (about a second).
		var rc *ndp.Conn
		for time.Now().Before(deadline) {
			if rc, _, err = ndp.Listen(ifi, ndp.LinkLocal); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond) // polls the kernel's address state; nothing to wait on
		}
		if err != nil {
			return err
		}
		defer rc.Close()
		// Solicit until answered: the server's address finishes its own
		// duplicate detection on the same schedule.
		for ra == nil && time.Now().Before(deadline) {
			_ = rc.WriteTo(&ndp.RouterSolicitation{}, nil, netip.MustParseAddr("ff02::2"))
			_ = rc.SetReadDeadline(time.Now().Add(time.Second))
			for ra == nil {
				m, _, _, err := rc.ReadFrom()
				if err != nil {
					break
				}
				ra, _ = m.(*ndp.RouterAdvertisement)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	<-mu
	l := logs.String()
	mu <- struct{}{}
	if ra == nil {
		t.Fatalf("no router advertisement within 20 s of the link coming up; the service logged:\n%s", l)
	}
	if strings.Contains(l, "router advertisements off") {
		t.Fatalf("the service turned advertisements off:\n%s", l)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
