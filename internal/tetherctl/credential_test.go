package tetherctl_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
)

// TestCredentialsAndNodeBMC drives credentials and nodes' BMC settings
// through the CLI against a real tetherd, and checks that the password
// shows up in no answer, no audit record and not in the clear in the
// database.
func TestCredentialsAndNodeBMC(t *testing.T) {
	const password = "Pa55-word-for-the-BMC-only"
	cp := testcp.Start(t)
	cfg := filepath.Join(cp.DataDir, daemon.AdminDir, daemon.ClientConfig)
	base := []string{"--config", cfg, "--endpoint", cp.Addr}
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "pw")
	if err := os.WriteFile(pwFile, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(dir, "ca.pem")
	caPEM, err := os.ReadFile(filepath.Join(cp.DataDir, daemon.AdminDir, daemon.AdminCAFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ca, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "os-release"), []byte("ID=x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var answers strings.Builder
	ok := func(args ...string) string {
		t.Helper()
		out, errOut, code := run(t, append(base, args...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
		answers.WriteString(out + errOut)
		return out
	}
	refused := func(want string, args ...string) {
		t.Helper()
		out, errOut, code := run(t, append(base, args...)...)
		if code == 0 || !strings.Contains(errOut, want) {
			t.Fatalf("%v: exit %d, want a refusal saying %q\n%s%s", args, code, want, out, errOut)
		}
		answers.WriteString(out + errOut)
	}
	fp := "sha256:" + strings.Repeat("ab", 32)
	addr := "redfish://127.0.0.1:8443/redfish/v1/Systems/1"

	ok("module", "build", dir, "base:1")
	ok("template", "create", "bm", "--root", "base:1")
	ok("credential", "create", "rack-a", "--username", "root", "--password-file", pwFile)
	refused("already exists", "credential", "create", "rack-a", "--username", "root", "--password-file", pwFile)
	if out := ok("credential", "list", "-o", "json"); !strings.Contains(out, `"rack-a"`) || !strings.Contains(out, `"root"`) {
		t.Errorf("credential list lacks the user name:\n%s", out)
	}
	ok("node", "create", "bm-1", "--template", "bm", "--mac", "52:54:00:00:10:01", "--bmc", addr, "--bmc-credentials", "rack-a", "--bmc-fingerprint", strings.ToUpper(fp))
	if out := ok("node", "get", "bm-1", "-o", "json"); !strings.Contains(out, fp) || !strings.Contains(out, addr) {
		t.Errorf("node get lacks the BMC (fingerprint normalised):\n%s", out)
	}
	// An update of one BMC field keeps the others.
	ok("node", "update", "bm-1", "--bmc-boot-mode", "legacy", "--bmc-ca", ca, "--bmc-fingerprint", "")
	out := ok("node", "get", "bm-1", "-o", "json")
	for _, want := range []string{addr, `Legacy`, "BEGIN CERTIFICATE", "rack-a"} {
		if !strings.Contains(out, want) {
			t.Errorf("after update, node lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, fp) {
		t.Errorf("--bmc-fingerprint \"\" did not clear the pin:\n%s", out)
	}

	for _, tc := range []struct {
		want string
		args []string
	}{
		{"does not exist", []string{"node", "create", "bm-2", "--template", "bm", "--mac", "52:54:00:00:10:02", "--bmc", addr, "--bmc-credentials", "nope"}},
		{"no hardware address", []string{"node", "create", "bm-2", "--template", "bm", "--bmc", addr, "--bmc-credentials", "rack-a"}},
		{"bmc.address", []string{"node", "create", "bm-2", "--template", "bm", "--mac", "52:54:00:00:10:02", "--bmc", "https://h/redfish/v1/Systems/1", "--bmc-credentials", "rack-a"}},
		{"holds user information", []string{"node", "create", "bm-2", "--template", "bm", "--mac", "52:54:00:00:10:02", "--bmc", "redfish://root:" + password + "@h/redfish/v1/Systems/1", "--bmc-credentials", "rack-a"}},
		{"contradicts", []string{"node", "create", "bm-2", "--template", "bm", "--mac", "52:54:00:00:10:02", "--bmc", addr, "--bmc-credentials", "rack-a", "--bmc-fingerprint", fp, "--bmc-insecure-skip-verify"}},
		{"bmc.fingerprint", []string{"node", "create", "bm-2", "--template", "bm", "--mac", "52:54:00:00:10:02", "--bmc", addr, "--bmc-credentials", "rack-a", "--bmc-fingerprint", "md5:00"}},
		{"bmc.boot_mode", []string{"node", "create", "bm-2", "--template", "bm", "--mac", "52:54:00:00:10:02", "--bmc", addr, "--bmc-credentials", "rack-a", "--bmc-boot-mode", "floppy"}},
		{"bmc.credential", []string{"node", "create", "bm-2", "--template", "bm", "--mac", "52:54:00:00:10:02", "--bmc", addr}},
		{"--bmc redfish://", []string{"node", "create", "bm-2", "--template", "bm", "--bmc-credentials", "rack-a"}},
		{"is used by nodes bm-1", []string{"credential", "delete", "rack-a"}},
		{"password-file", []string{"credential", "create", "x", "--username", "root", "--password-file", filepath.Join(dir, "missing")}},
	} {
		refused(tc.want, tc.args...)
	}
	pw2 := filepath.Join(dir, "pw2")
	if err := os.WriteFile(pw2, []byte("rotated-"+password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := ok("credential", "update", "rack-a", "--password-file", pw2, "--username", "admin", "-o", "json"); !strings.Contains(out, `"admin"`) {
		t.Errorf("credential update did not change the user name:\n%s", out)
	}
	refused("not found", "credential", "update", "nope", "--password-file", pw2)
	ok("node", "update", "bm-1", "--bmc", "")
	if out := ok("node", "get", "bm-1", "-o", "json"); strings.Contains(out, "bmc") {
		t.Errorf("--bmc \"\" left a BMC:\n%s", out)
	}
	ok("credential", "delete", "rack-a")
	if out := ok("audit", "-o", "json"); !strings.Contains(out, "CreateCredential") || !strings.Contains(out, "name=rack-a") {
		t.Errorf("the audit trail lacks the credential's creation:\n%s", out)
	}

	if strings.Contains(answers.String(), password) {
		t.Errorf("an answer, an error or the audit trail shows the password:\n%s", answers.String())
	}
	// Not in the clear in the database either (the WAL included).
	files, _ := filepath.Glob(filepath.Join(cp.DataDir, daemon.SQLiteFile+"*"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(password)) {
			t.Errorf("%s holds the password in the clear", f)
		}
	}
}
