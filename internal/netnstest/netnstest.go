// Package netnstest gives a test its own network namespace with a veth
// pair in it, so that DHCP and other link-level traffic never leaves the
// machine's test sandbox. The namespace is removed when the test ends,
// even when it fails. It needs root and iproute2; without them the test
// is skipped, loudly.
package netnstest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// NS is a namespace holding a veth pair: Server (with ServerCIDR) and Client.
type NS struct {
	Name           string
	Server, Client string
	ServerCIDR     string
}

// New creates the namespace, or skips the test naming what is missing.
func New(t testing.TB, serverCIDR string) *NS {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIP: needs root to create a network namespace (run the test as root)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("SKIP: needs the ip command (iproute2) to create a network namespace")
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	ns := &NS{Name: "tether-" + hex.EncodeToString(b), Server: "tsrv0", Client: "tcli0", ServerCIDR: serverCIDR}
	if err := ip("netns", "add", ns.Name); err != nil {
		t.Fatalf("create network namespace: %v", err)
	}
	t.Cleanup(func() {
		if err := ip("netns", "del", ns.Name); err != nil {
			t.Errorf("remove network namespace %s: %v", ns.Name, err)
		}
	})
	for _, args := range [][]string{
		{"link", "add", ns.Server, "type", "veth", "peer", "name", ns.Client},
		{"addr", "add", serverCIDR, "dev", ns.Server},
		{"link", "set", "lo", "up"},
		{"link", "set", ns.Server, "up"},
		{"link", "set", ns.Client, "up"},
	} {
		if err := ip(append([]string{"-n", ns.Name}, args...)...); err != nil {
			t.Fatalf("set up namespace %s: %v", ns.Name, err)
		}
	}
	return ns
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// Do runs f on a thread inside the namespace. Sockets f opens stay in the
// namespace after Do returns, whichever goroutine uses them.
func (ns *NS) Do(f func() error) error {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open own namespace: %w", err)
	}
	defer orig.Close()
	target, err := os.Open("/var/run/netns/" + ns.Name)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open namespace %s: %w", ns.Name, err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter namespace %s: %w", ns.Name, err)
	}
	ferr := f()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays in the namespace: keep it locked so that Go
		// retires it instead of running other goroutines on it.
		return fmt.Errorf("leave namespace %s: %w", ns.Name, err)
	}
	runtime.UnlockOSThread()
	return ferr
}
