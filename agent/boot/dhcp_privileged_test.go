package boot

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"
)

// TestDHCPPrivileged takes a real DHCPv4 lease through u-root's client, in
// a fresh network namespace of a re-executed test binary: a test DHCP
// server answers on one end of a veth pair, the agent's code asks on the
// other, named by BOOTIF.
func TestDHCPPrivileged(t *testing.T) {
	if os.Getenv(childEnv) == t.Name() {
		dhcpChild(t)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("skipped: needs root (network namespaces, netlink writes, raw DHCP sockets); CI runs it as root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("skipped: needs iproute2's ip to create a veth pair for the test")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v")
	cmd.Env = append(os.Environ(), childEnv+"="+t.Name())
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:   syscall.CLONE_NEWNET | syscall.CLONE_NEWUTS,
		Unshareflags: syscall.CLONE_NEWNS,
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child in a new network namespace failed: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("child did not run the test:\n%s", out)
	}
}

func dhcpChild(t *testing.T) {
	if err := syscall.Mount("sysfs", "/sys", "sysfs", 0, ""); err != nil {
		t.Fatalf("mount a sysfs for this network namespace: %v", err)
	}
	// The lease writes /etc/resolv.conf: give this mount namespace its own.
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(resolv, "/etc/resolv.conf", "", syscall.MS_BIND, ""); err != nil {
		t.Fatalf("bind a private /etc/resolv.conf: %v", err)
	}
	for _, args := range [][]string{
		{"link", "add", "t0", "type", "veth", "peer", "name", "t1"},
		{"link", "add", "t2", "type", "veth", "peer", "name", "t3"},
		{"addr", "add", "10.0.9.1/24", "dev", "t1"},
		{"link", "set", "t1", "up"},
		{"link", "set", "t3", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Skipf("skipped: cannot set up the veth pairs (ip %s: %v: %s)", strings.Join(args, " "), err, out)
		}
	}
	t0, err := net.InterfaceByName("t0")
	if err != nil {
		t.Fatal(err)
	}
	server := net.ParseIP("10.0.9.1").To4()
	seen := make(chan dhcpv4.MessageType, 16)
	handler := func(conn net.PacketConn, peer net.Addr, m *dhcpv4.DHCPv4) {
		var typ dhcpv4.MessageType
		switch m.MessageType() {
		case dhcpv4.MessageTypeDiscover:
			typ = dhcpv4.MessageTypeOffer
		case dhcpv4.MessageTypeRequest:
			typ = dhcpv4.MessageTypeAck
		default:
			return
		}
		seen <- m.MessageType()
		resp, err := dhcpv4.NewReplyFromRequest(m,
			dhcpv4.WithMessageType(typ),
			dhcpv4.WithYourIP(net.ParseIP("10.0.9.50")),
			dhcpv4.WithServerIP(server),
			dhcpv4.WithNetmask(net.CIDRMask(24, 32)),
			dhcpv4.WithRouter(server),
			dhcpv4.WithDNS(net.ParseIP("10.0.9.53")),
			dhcpv4.WithLeaseTime(3600),
			dhcpv4.WithOption(dhcpv4.OptServerIdentifier(server)),
		)
		if err != nil {
			t.Errorf("build the reply: %v", err)
			return
		}
		if _, err := conn.WriteTo(resp.ToBytes(), &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ClientPort}); err != nil {
			t.Errorf("send the reply: %v", err)
		}
	}
	srv, err := server4.NewServer("t1", &net.UDPAddr{IP: net.IPv4zero, Port: dhcpv4.ServerPort}, handler)
	if err != nil {
		t.Fatalf("test DHCP server: %v", err)
	}
	go func() { _ = srv.Serve() }()
	defer srv.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	leases := t.TempDir()
	var logs strings.Builder
	bootif := "01-" + strings.ReplaceAll(t0.HardwareAddr.String(), ":", "-")
	summary, err := ConfigureNetwork(ctx, "console=ttyS0 ip=dhcp BOOTIF="+bootif, NetworkOptions{
		LeaseDir: leases, Logf: func(f string, a ...any) { logs.WriteString(f + "\n") },
	})
	if err != nil {
		t.Fatalf("ConfigureNetwork with DHCP: %v\nlog:\n%s", err, logs.String())
	}
	for _, want := range []string{"DHCP on t0 (" + t0.HardwareAddr.String() + "): 10.0.9.50/24", "router 10.0.9.1", "dns 10.0.9.53", "lease 1h0m0s", "boot interface"} {
		if !strings.Contains(summary, want) {
			t.Errorf("summary %q lacks %q", summary, want)
		}
	}
	addrs, _ := t0.Addrs()
	var got []string
	for _, a := range addrs {
		got = append(got, a.String())
	}
	if !contains(got, "10.0.9.50/24") {
		t.Errorf("t0 addresses = %q, want 10.0.9.50/24 among them", got)
	}
	if gw := defaultGateway(t, "t0"); gw.String() != "10.0.9.1" {
		t.Errorf("default route via %v, want 10.0.9.1 on t0", gw)
	}
	if b, _ := os.ReadFile("/etc/resolv.conf"); !strings.Contains(string(b), "nameserver 10.0.9.53") {
		t.Errorf("/etc/resolv.conf = %q, want nameserver 10.0.9.53", b)
	}
	saved, err := loadLeases(leases)
	if err != nil || len(saved) != 1 || saved[0].Interface != "t0" {
		t.Fatalf("saved leases = %+v, %v; want one for t0", saved, err)
	}
}
