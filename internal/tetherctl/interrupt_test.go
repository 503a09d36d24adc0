package tetherctl_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	"github.com/tetherfleet/tether/internal/tetherctl"
)

// With TETHERCTL_AS_MAIN=1 the test binary is tetherctl itself, so a test
// can send it a real SIGINT.
func TestMain(m *testing.M) {
	if os.Getenv("TETHERCTL_AS_MAIN") == "1" {
		os.Exit(tetherctl.Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// Ctrl-C ends `instance wait` at once (it would poll for an hour), with
// the shell's exit status for an interrupt.
func TestCtrlCStopsInstanceWait(t *testing.T) {
	cp := testcp.Start(t)
	base := []string{"--config", filepath.Join(cp.DataDir, daemon.AdminDir, daemon.ClientConfig), "--endpoint", cp.Addr}
	if out, errOut, code := run(t, append(base, "module", "build", t.TempDir(), "base:1")...); code != 0 {
		t.Fatalf("module build: %s %s", out, errOut)
	}
	for _, args := range [][]string{{"template", "create", "web", "--root", "base:1"}, {"node", "create", "edge-1", "--template", "web"}} {
		if out, errOut, code := run(t, append(base, args...)...); code != 0 {
			t.Fatalf("%v: %s %s", args, out, errOut)
		}
	}
	// An external instance stays provisioning: nothing boots it.
	out, errOut, code := run(t, append(base, "instance", "provision", "--node", "edge-1", "--provider", "external", "-o", "json")...)
	var prov struct {
		Instance struct {
			ID string `json:"id"`
		} `json:"instance"`
	}
	if err := json.Unmarshal([]byte(out), &prov); code != 0 || err != nil {
		t.Fatalf("provision: %v %s", err, errOut)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], append(base, "instance", "wait", prov.Instance.ID, "--for", "1h")...)
	cmd.Env = append(os.Environ(), "TETHERCTL_AS_MAIN=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The first status line means the poll loop (and the signal handler) runs.
	first, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.Contains(first, "provisioning") {
		t.Fatalf("first line %q: %v (stderr %s)", first, err, stderr.String())
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	if ctx.Err() != nil {
		t.Fatalf("instance wait ignored SIGINT until the test gave up")
	}
	if code := cmd.ProcessState.ExitCode(); code != tetherctl.ExitInterrupted || !strings.Contains(stderr.String(), "interrupted") {
		t.Fatalf("after SIGINT: exit %d (%v), stderr %q", code, err, stderr.String())
	}
}
