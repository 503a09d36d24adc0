package tetherctl_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	"github.com/tetherfleet/tether/internal/tetherctl"
)

func run(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := tetherctl.Main(args, &out, &errb)
	return out.String(), errb.String(), code
}

func TestCommandsAgainstARealServer(t *testing.T) {
	cp := testcp.Start(t)
	cfg := filepath.Join(cp.DataDir, daemon.AdminDir, daemon.ClientConfig)
	base := []string{"--config", cfg, "--endpoint", cp.Addr}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "os-release"), []byte("ID=x\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	// module build DIR NAME:VERSION builds with go-erofs and pushes.
	if out, errOut, code := run(t, append(base, "module", "build", dir, "base:1")...); code != 0 {
		t.Fatalf("module build: %s %s", out, errOut)
	}
	for _, args := range [][]string{
		{"template", "create", "web", "--root", "base:1"},
		{"node", "create", "edge-1", "--template", "web", "--config-json", `{"rack":"a"}`},
		{"instance", "provision", "--node", "edge-1", "--provider", "external", "--operation-id", "op-1"},
	} {
		if out, errOut, code := run(t, append(base, args...)...); code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
	}

	// -o json is one JSON document on stdout.
	out, errOut, code := run(t, append(base, "instance", "list", "-o", "json")...)
	if code != 0 {
		t.Fatalf("instance list: %s", errOut)
	}
	var list struct {
		Instances []struct {
			ID       string `json:"id"`
			NodeName string `json:"node_name"`
			Status   string `json:"status"`
		} `json:"instances"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("-o json is not one JSON document: %v\n%s", err, out)
	}
	if len(list.Instances) != 1 || list.Instances[0].NodeName != "edge-1" || list.Instances[0].Status != "INSTANCE_STATUS_PROVISIONING" {
		t.Fatalf("instance list json: %+v", list)
	}
	// Tables have headers and the row.
	out, _, _ = run(t, append(base, "node", "list")...)
	if !strings.Contains(out, "NAME") || !strings.Contains(out, "edge-1") {
		t.Fatalf("node list table:\n%s", out)
	}
	// A task for the instance; get shows it pending.
	out, errOut, code = run(t, append(base, "task", "create", "--instance", list.Instances[0].ID, "-o", "json", "exec", "--", "cat", "/etc/os-release")...)
	if code != 0 {
		t.Fatalf("task create: %s", errOut)
	}
	var task struct {
		ID   string `json:"id"`
		Exec struct {
			Argv []string `json:"argv"`
		} `json:"exec"`
	}
	if err := json.Unmarshal([]byte(out), &task); err != nil || len(task.Exec.Argv) != 2 {
		t.Fatalf("task json: %v %s", err, out)
	}
	// Errors: stderr, non-zero exit, the server's words.
	out, errOut, code = run(t, append(base, "node", "get", "nope", "-o", "json")...)
	if code == 0 || out != "" || !strings.Contains(errOut, `node "nope" not found`) {
		t.Fatalf("error path: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = run(t, append(base, "template", "create", "bad", "--root", "nope:1")...)
	if code == 0 || !strings.Contains(errOut, "root_modules[0]") {
		t.Fatalf("invalid argument must name the field: %q", errOut)
	}
	// events --kind filters.
	out, _, code = run(t, append(base, "events", "--kind", "module.pushed", "-o", "json")...)
	if code != 0 || !strings.Contains(out, "module.pushed") {
		t.Fatalf("events: %s", out)
	}
}

func TestConnectionErrorsSayWhere(t *testing.T) {
	cp := testcp.Start(t)
	cfg := filepath.Join(cp.DataDir, daemon.AdminDir, daemon.ClientConfig)
	_, errOut, code := run(t, "--config", cfg, "--endpoint", "127.0.0.1:1", "--timeout", "3s", "node", "list")
	if code == 0 || !strings.Contains(errOut, "127.0.0.1:1") || !strings.Contains(errOut, cfg) {
		t.Fatalf("unreachable server: %q", errOut)
	}
	_, errOut, code = run(t, "--config", filepath.Join(t.TempDir(), "missing.yaml"), "node", "list")
	if code == 0 || !strings.Contains(errOut, "missing.yaml") || !strings.Contains(errOut, "tetherd init") {
		t.Fatalf("missing config: %q", errOut)
	}
	// A client certificate from another CA: the server's refusal is explained.
	other := testcp.Start(t)
	otherCfg := filepath.Join(other.DataDir, daemon.AdminDir, daemon.ClientConfig)
	_, errOut, code = run(t, "--config", otherCfg, "--endpoint", cp.Addr, "--timeout", "5s", "node", "list")
	if code == 0 || !strings.Contains(errOut, cp.Addr) {
		t.Fatalf("wrong CA: %q", errOut)
	}
}
