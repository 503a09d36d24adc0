package tetherctl_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
)

// TestNodeEKFlagsRoundTrip: --ek binds TPMs to a node (shown in the
// table and in -o json), --require-attestation refuses tokens, --clear-ek
// empties the set, and a malformed hash is refused naming the value.
func TestNodeEKFlagsRoundTrip(t *testing.T) {
	cp := testcp.Start(t)
	cfg := filepath.Join(cp.DataDir, daemon.AdminDir, daemon.ClientConfig)
	base := []string{"--config", cfg, "--endpoint", cp.Addr}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "os-release"), []byte("ID=x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	a, b := "sha256:"+strings.Repeat("a", 64), "sha256:"+strings.Repeat("b", 64)
	ok := func(args ...string) string {
		t.Helper()
		out, errOut, code := run(t, append(base, args...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
		return out
	}
	ok("module", "build", dir, "base:1")
	ok("template", "create", "web", "--root", "base:1")

	// A malformed hash is refused, naming it, and creates nothing.
	out, errOut, code := run(t, append(base, "node", "create", "n1", "--template", "web", "--ek", "sha256:1234")...)
	if code == 0 || !strings.Contains(errOut, "sha256:1234") || !strings.Contains(errOut, "ek_hashes") {
		t.Fatalf("bad --ek: exit %d\n%s%s", code, out, errOut)
	}
	ok("node", "create", "n1", "--template", "web", "--ek", a, "--ek", "sha256:"+strings.ToUpper(b[7:]), "--require-attestation")
	if out := ok("node", "get", "n1"); !strings.Contains(out, a) || !strings.Contains(out, b) || !strings.Contains(out, "attestation required") {
		t.Fatalf("node get does not show the EKs:\n%s", out)
	}
	var n struct {
		EkHashes           []string `json:"ek_hashes"`
		RequireAttestation bool     `json:"require_attestation"`
	}
	if err := json.Unmarshal([]byte(ok("node", "get", "n1", "-o", "json")), &n); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(n.EkHashes, []string{a, b}) || !n.RequireAttestation {
		t.Fatalf("-o json: %+v", n)
	}
	ok("node", "update", "n1", "--clear-ek", "--require-attestation=false")
	n.EkHashes, n.RequireAttestation = nil, false // protojson leaves out what is empty
	if err := json.Unmarshal([]byte(ok("node", "get", "n1", "-o", "json")), &n); err != nil {
		t.Fatal(err)
	}
	if len(n.EkHashes) != 0 || n.RequireAttestation {
		t.Fatalf("after --clear-ek --require-attestation=false: %+v", n)
	}
	if _, errOut, code := run(t, append(base, "node", "update", "n1", "--clear-ek", "--ek", a)...); code == 0 || !strings.Contains(errOut, "--clear-ek and --ek") {
		t.Fatalf("--clear-ek with --ek: exit %d %s", code, errOut)
	}
}
