package tetherctl_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
)

func TestTemplateConsole(t *testing.T) {
	cp := testcp.Start(t)
	cfg := filepath.Join(cp.DataDir, daemon.AdminDir, daemon.ClientConfig)
	base := []string{"--config", cfg, "--endpoint", cp.Addr, "-o", "json"}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "os-release"), []byte("ID=x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args []string
		want string // in stdout; "" means the command fails
	}{
		{[]string{"module", "build", dir, "base:1"}, "base"},
		{[]string{"template", "create", "serial", "--root", "base:1"}, `"console":"ttyS0"`},
		{[]string{"template", "create", "second", "--root", "base:1", "--console", "ttyS1,115200n8"}, `"console":"ttyS1,115200n8"`},
		{[]string{"template", "update", "second", "--console", "none"}, `"console":"none"`},
		{[]string{"template", "update", "second", "--kernel-args", "quiet"}, `"console":"none"`}, // untouched without the flag
		{[]string{"template", "update", "second", "--console", "ttyS0 init=/bin/sh"}, ""},
	}
	for _, tc := range tests {
		out, errOut, code := run(t, append(base, tc.args...)...)
		compact := strings.Join(strings.Fields(out), "")
		switch {
		case tc.want == "" && code == 0:
			t.Errorf("%v succeeded; want a refusal", tc.args)
		case tc.want == "" && !strings.Contains(errOut, "console"):
			t.Errorf("%v: the refusal does not name the console: %s", tc.args, errOut)
		case tc.want != "" && (code != 0 || !strings.Contains(compact, tc.want)):
			t.Errorf("%v: exit %d, out %s %s; want %s", tc.args, code, compact, errOut, tc.want)
		}
	}
}
