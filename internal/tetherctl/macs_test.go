package tetherctl_test

import (
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
)

func TestNodeMACs(t *testing.T) {
	cp := testcp.Start(t)
	cfg := filepath.Join(cp.DataDir, daemon.AdminDir, daemon.ClientConfig)
	base := []string{"--config", cfg, "--endpoint", cp.Addr}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "os-release"), []byte("ID=x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"module", "build", dir, "base:1"},
		{"template", "create", "web", "--root", "base:1"},
		{"node", "create", "rack1-07", "--template", "web", "--mac", "52:54:00:AA:00:01", "--mac", "52-54-00-aa-00-02"},
	} {
		if out, errOut, code := run(t, append(base, args...)...); code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
	}
	out, _, _ := run(t, append(base, "node", "get", "rack1-07")...)
	if !strings.Contains(out, "52:54:00:aa:00:01,52:54:00:aa:00:02") {
		t.Fatalf("node get does not show the normalised addresses:\n%s", out)
	}

	tests := []struct {
		name string
		args []string
		want string // in stderr
	}{
		{"taken by another node", []string{"node", "create", "rack1-08", "--template", "web", "--mac", "52:54:00:aa:00:02"}, `already exists: macs`},
		{"names the owner", []string{"node", "create", "rack1-08", "--template", "web", "--mac", "52:54:00:aa:00:02"}, `rack1-07`},
		{"malformed", []string{"node", "create", "rack1-08", "--template", "web", "--mac", "52:54:00:aa:00"}, `invalid argument: macs`},
		{"multicast", []string{"node", "create", "rack1-08", "--template", "web", "--mac", "01:00:5e:00:00:01"}, `multicast`},
		{"twice", []string{"node", "create", "rack1-08", "--template", "web", "--mac", "52:54:00:aa:00:03", "--mac", "52:54:00:AA:00:03"}, `given twice`},
		{"update to a taken one", []string{"node", "update", "rack1-09", "--mac", "52:54:00:aa:00:01"}, `rack1-07`},
	}
	if _, errOut, code := run(t, append(base, "node", "create", "rack1-09", "--template", "web")...); code != 0 {
		t.Fatal(errOut)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, errOut, code := run(t, append(base, tc.args...)...)
			if code == 0 || !strings.Contains(errOut, tc.want) {
				t.Fatalf("exit %d, stderr %q; want a failure mentioning %q", code, errOut, tc.want)
			}
		})
	}
	// The refused create left no node behind.
	if _, _, code := run(t, append(base, "node", "get", "rack1-08")...); code == 0 {
		t.Fatal("a refused node create left the node behind")
	}
	// update --mac replaces the set; --mac "" clears it.
	if _, errOut, code := run(t, append(base, "node", "update", "rack1-07", "--mac", "52:54:00:aa:00:09")...); code != 0 {
		t.Fatal(errOut)
	}
	if _, errOut, code := run(t, append(base, "node", "update", "rack1-09", "--mac", "52:54:00:aa:00:01")...); code != 0 {
		t.Fatalf("an address freed by an update is not reusable: %s", errOut)
	}
	if _, errOut, code := run(t, append(base, "node", "update", "rack1-09", "--mac", "")...); code != 0 {
		t.Fatal(errOut)
	}
	out, _, _ = run(t, append(base, "node", "get", "rack1-09")...)
	if strings.Contains(out, "52:54:00:aa:00:01") {
		t.Fatalf("--mac \"\" did not clear the addresses:\n%s", out)
	}
}

func TestNetbootSeen(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cp := testcp.Start(t, testcp.With(func(o *daemon.ServeOptions) { o.Test.NetbootListener = lis }))
	cfg := filepath.Join(cp.DataDir, daemon.AdminDir, daemon.ClientConfig)
	base := []string{"--config", cfg, "--endpoint", cp.Addr}
	ask := func(mac string) {
		resp, err := http.Get("http://" + lis.Addr().String() + "/ipxe/boot?mac=" + mac)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), "exit 1") {
			t.Fatalf("an unknown machine got %q", b)
		}
	}
	ask("52:54:00:AA:BB:01")
	ask("52:54:00:aa:bb:02")
	ask("not-a-mac")
	out, errOut, code := run(t, append(base, "netboot", "seen")...)
	if code != 0 || !strings.Contains(out, "52:54:00:aa:bb:01") || !strings.Contains(out, "52:54:00:aa:bb:02") || strings.Contains(out, "not-a-mac") {
		t.Fatalf("netboot seen: exit %d\n%s%s", code, out, errOut)
	}
	// Adopting a machine takes it off the list.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "os-release"), []byte("ID=x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"module", "build", dir, "base:1"},
		{"template", "create", "web", "--root", "base:1"},
		{"node", "create", "rack1-07", "--template", "web", "--mac", "52:54:00:aa:bb:01"},
	} {
		if out, errOut, code := run(t, append(base, args...)...); code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
	}
	out, _, _ = run(t, append(base, "netboot", "seen", "-o", "json")...)
	if strings.Contains(out, "52:54:00:aa:bb:01") || !strings.Contains(out, `"mac":"52:54:00:aa:bb:02"`) {
		t.Fatalf("netboot seen after adoption:\n%s", out)
	}
}
