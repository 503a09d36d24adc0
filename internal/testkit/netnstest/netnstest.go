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

// NS is a pair of namespaces joined by a veth pair: Server (with
// ServerCIDR) in Name, and Client in ClientName, so that traffic between
// the two ends crosses the link as it would between two machines (in one
// namespace, packets to a local address would take the loopback).
type NS struct {
	Name, ClientName string
	Server, Client   string
	ServerCIDR       string
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
	id := hex.EncodeToString(b)
	ns := &NS{Name: "tether-" + id, ClientName: "tether-" + id + "-c", Server: "tsrv0", Client: "tcli0", ServerCIDR: serverCIDR}
	for _, name := range []string{ns.Name, ns.ClientName} {
		if err := ip("netns", "add", name); err != nil {
			t.Fatalf("create network namespace: %v", err)
		}
		t.Cleanup(func() {
			if err := ip("netns", "del", name); err != nil {
				t.Errorf("remove network namespace %s: %v", name, err)
			}
		})
	}
	for _, args := range [][]string{
		{"-n", ns.Name, "link", "add", ns.Server, "type", "veth", "peer", "name", ns.Client, "netns", ns.ClientName},
		{"-n", ns.Name, "addr", "add", serverCIDR, "dev", ns.Server},
		{"-n", ns.Name, "link", "set", "lo", "up"},
		{"-n", ns.Name, "link", "set", ns.Server, "up"},
		{"-n", ns.ClientName, "link", "set", "lo", "up"},
		{"-n", ns.ClientName, "link", "set", ns.Client, "up"},
	} {
		if err := ip(args...); err != nil {
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

// Do runs f on a thread inside the server's namespace. Sockets f opens
// stay in the namespace after Do returns, whichever goroutine uses them.
func (ns *NS) Do(f func() error) error { return do(ns.Name, f) }

// DoClient is Do in the client's namespace.
func (ns *NS) DoClient(f func() error) error { return do(ns.ClientName, f) }

func do(name string, f func() error) error {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open own namespace: %w", err)
	}
	defer orig.Close()
	target, err := os.Open("/var/run/netns/" + name)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open namespace %s: %w", name, err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter namespace %s: %w", name, err)
	}
	ferr := f()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays in the namespace: keep it locked so that Go
		// retires it instead of running other goroutines on it.
		return fmt.Errorf("leave namespace %s: %w", name, err)
	}
	runtime.UnlockOSThread()
	return ferr
}

// AddClientAddr gives the client end an address too (load generators that
// send from an ordinary UDP socket need one).
func (ns *NS) AddClientAddr(t testing.TB, cidr string) {
	t.Helper()
	if err := ip("-n", ns.ClientName, "addr", "add", cidr, "dev", ns.Client); err != nil {
		t.Fatal(err)
	}
}

// Go runs f in a new goroutine on a thread that enters the server's
// namespace for good: everything f opens directly is in the namespace.
// The thread is discarded when f returns.
func (ns *NS) Go(f func()) {
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		target, err := os.Open("/var/run/netns/" + ns.Name)
		if err != nil {
			panic(fmt.Sprintf("open namespace %s: %v", ns.Name, err))
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			panic(fmt.Sprintf("enter namespace %s: %v", ns.Name, err))
		}
		f()
	}()
}
