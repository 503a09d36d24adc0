package tetherctl_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	"github.com/tetherfleet/tether/internal/tetherctl"
)

func TestSigningIdentitiesAndAuditCommands(t *testing.T) {
	cp := testcp.Start(t)
	cfg := filepath.Join(cp.DataDir, daemon.AdminDir, daemon.ClientConfig)
	base := []string{"--config", cfg, "--endpoint", cp.Addr}
	must := func(args ...string) string {
		t.Helper()
		out, errOut, code := run(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
		return out
	}
	keys := filepath.Join(t.TempDir(), "alice")
	out := must("signer", "create", "alice", "--out", keys)
	fp := regexp.MustCompile(`sha256:[0-9a-f]{64}`).FindString(out)
	if fp == "" {
		t.Fatalf("signer create printed no fingerprint:\n%s", out)
	}
	if st, err := os.Stat(filepath.Join(keys, tetherctl.SignerKeyFile)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("private key file: %v %v", st, err)
	}
	if _, errOut, code := run(t, "signer", "create", "alice", "--out", keys); code == 0 || !strings.Contains(errOut, "refusing to overwrite") {
		t.Fatalf("a second create over the same key must be refused: %s", errOut)
	}
	img := filepath.Join(t.TempDir(), "m.erofs")
	if err := os.WriteFile(img, testcp.TinyErofs(), 0o644); err != nil {
		t.Fatal(err)
	}
	// Signed with a key the control plane does not know: refused.
	if _, errOut, code := run(t, append(base, "module", "push", "base:1", img, "--sign-with", filepath.Join(keys, tetherctl.SignerKeyFile))...); code == 0 || !strings.Contains(errOut, "signer") {
		t.Fatalf("push signed by an unknown signer: %s", errOut)
	}
	must(append(base, "signer", "add", "alice", "--key", filepath.Join(keys, tetherctl.SignerPubFile))...)
	must(append(base, "module", "push", "base:1", img, "--sign-with", filepath.Join(keys, tetherctl.SignerKeyFile))...)
	if out := must(append(base, "module", "get", "base:1")...); !strings.Contains(out, fp) || !strings.Contains(out, "alice") {
		t.Fatalf("module get does not list alice's signature:\n%s", out)
	}
	// module sign attaches a second signer's signature to a pushed module.
	bobKeys := filepath.Join(t.TempDir(), "bob")
	bobFP := regexp.MustCompile(`sha256:[0-9a-f]{64}`).FindString(must("signer", "create", "bob", "--out", bobKeys))
	must(append(base, "signer", "add", "bob", "--key", filepath.Join(bobKeys, tetherctl.SignerPubFile))...)
	if out := must(append(base, "module", "sign", "base:1", "--key", filepath.Join(bobKeys, tetherctl.SignerKeyFile))...); !strings.Contains(out, bobFP) || !strings.Contains(out, fp) {
		t.Fatalf("module sign output lacks both signers:\n%s", out)
	}
	must(append(base, "template", "create", "web", "--root", "base:1", "--require-signer", fp, "--require-signer", bobFP)...)
	if out := must(append(base, "template", "get", "web")...); !strings.Contains(out, fp) {
		t.Fatalf("template get lacks the required signer:\n%s", out)
	}

	// An operator identity with its own client config.
	opDir := filepath.Join(t.TempDir(), "otto")
	must(append(base, "identity", "create", "otto", "--role", "operator", "--out", opDir)...)
	opCfg := []string{"--config", filepath.Join(opDir, "tetherconfig.yaml")}
	must(append(opCfg, "node", "list")...)
	if _, errOut, code := run(t, append(opCfg, "identity", "list")...); code == 0 || !strings.Contains(errOut, "admin") {
		t.Fatalf("an operator listed identities: %s", errOut)
	}
	must(append(opCfg, "identity", "renew")...)
	must(append(opCfg, "node", "list")...)
	if out := must(append(base, "identity", "list")...); !strings.Contains(out, "otto") || !strings.Contains(out, "operator") {
		t.Fatalf("identity list:\n%s", out)
	}
	out = must(append(base, "audit", "--identity", "otto")...)
	if !strings.Contains(out, "RenewIdentity") || !strings.Contains(out, "PermissionDenied") {
		t.Fatalf("audit for otto:\n%s", out)
	}
	must(append(base, "identity", "revoke", "otto")...)
	if _, errOut, code := run(t, append(opCfg, "node", "list")...); code == 0 || !strings.Contains(errOut, "revoked") {
		t.Fatalf("a revoked identity was served: %s", errOut)
	}
}
