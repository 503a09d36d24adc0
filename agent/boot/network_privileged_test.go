package boot

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

const childEnv = "TETHER_BOOT_TEST_CHILD"

// TestConfigureNetworkPrivileged runs ConfigureNetwork for real, in a fresh
// network (and UTS) namespace of a re-executed test binary, on one end of a
// veth pair, so the host's interfaces, routes and hostname are never touched.
func TestConfigureNetworkPrivileged(t *testing.T) {
	if os.Getenv(childEnv) == t.Name() {
		configureNetworkChild(t)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("skipped: needs root (network namespaces, netlink writes); CI runs it as root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("skipped: needs iproute2's ip to create a veth pair for the test")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v")
	cmd.Env = append(os.Environ(), childEnv+"="+t.Name())
	// A mount namespace too, for a sysfs that shows the new network
	// namespace (Unshareflags makes the child's mounts private first).
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

func configureNetworkChild(t *testing.T) {
	if err := syscall.Mount("sysfs", "/sys", "sysfs", 0, ""); err != nil {
		t.Fatalf("mount a sysfs for this network namespace: %v", err)
	}
	for _, args := range [][]string{
		{"link", "add", "t0", "type", "veth", "peer", "name", "t1"},
		{"link", "set", "t1", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Skipf("skipped: cannot create a veth pair (ip %s: %v: %s)", strings.Join(args, " "), err, out)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const cmdline = "console=ttyS0 ip=10.0.2.15::10.0.2.2:255.255.255.0:tether-test:t0:off quiet"
	// Twice: the second run must accept its own earlier work.
	for i := 0; i < 2; i++ {
		summary, err := ConfigureNetwork(ctx, cmdline, NetworkOptions{})
		if err != nil {
			t.Fatalf("ConfigureNetwork (run %d): %v", i+1, err)
		}
		if summary != "static 10.0.2.15/24 on t0" {
			t.Fatalf("summary = %q, want static 10.0.2.15/24 on t0", summary)
		}
	}

	for name, want := range map[string]string{"lo": "127.0.0.1/8", "t0": "10.0.2.15/24"} {
		ifi, err := net.InterfaceByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if ifi.Flags&net.FlagUp == 0 || ifi.Flags&net.FlagRunning == 0 {
			t.Errorf("%s flags = %v, want up and running", name, ifi.Flags)
		}
		addrs, _ := ifi.Addrs()
		var got []string
		for _, a := range addrs {
			got = append(got, a.String())
		}
		if !contains(got, want) {
			t.Errorf("%s addresses = %q, want %s among them", name, got, want)
		}
	}
	if gw := defaultGateway(t, "t0"); gw != netip.MustParseAddr("10.0.2.2") {
		t.Errorf("default route via %v, want 10.0.2.2 on t0", gw)
	}
	if h, _ := os.Hostname(); h != "tether-test" {
		t.Errorf("hostname = %q, want tether-test", h)
	}

	// A device that never shows up fails within the bound, naming it.
	short, cancel2 := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel2()
	_, err := ConfigureNetwork(short, "ip=10.0.3.15:::255.255.255.0::nosuch0:off", NetworkOptions{})
	if err == nil || !strings.Contains(err.Error(), "device nosuch0") {
		t.Errorf("missing device: err = %v, want it to name device nosuch0", err)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// defaultGateway reads /proc/net/route, which needs no tool to parse.
func defaultGateway(t *testing.T, dev string) netip.Addr {
	f, err := os.Open("/proc/net/route")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 3 || fields[0] != dev || fields[1] != "00000000" {
			continue
		}
		b, err := hex.DecodeString(fields[2])
		if err != nil || len(b) != 4 {
			t.Fatalf("bad gateway field %q", fields[2])
		}
		var a [4]byte
		binary.LittleEndian.PutUint32(a[:], binary.BigEndian.Uint32(b))
		return netip.AddrFrom4(a)
	}
	return netip.Addr{}
}
