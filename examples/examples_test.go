package examples

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBuildIsReproducibleAndComplete runs build.sh twice, checks the two
// builds are byte-identical, then extracts the root image with fsck.erofs
// and checks what the agent and the tests rely on.
func TestBuildIsReproducibleAndComplete(t *testing.T) {
	for _, tool := range []string{"mkfs.erofs", "fsck.erofs"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("skipped: needs %s (apt-get install erofs-utils)", tool)
		}
	}
	var outputs []string
	for i := 0; i < 2; i++ {
		dir := t.TempDir()
		out, err := exec.Command("./build.sh", dir).CombinedOutput()
		if err != nil {
			t.Fatalf("build.sh: %v\n%s", err, out)
		}
		// Lines are "PATH SIZE sha256:HEX"; compare without the folder.
		outputs = append(outputs, strings.ReplaceAll(string(out), dir+"/", ""))
		if i == 0 {
			checkRoot(t, filepath.Join(dir, "tether-example-root.erofs"))
		}
	}
	if outputs[0] != outputs[1] {
		t.Fatalf("two builds differ:\n%s\n%s", outputs[0], outputs[1])
	}
	for _, line := range strings.Split(strings.TrimSpace(outputs[0]), "\n") {
		if f := strings.Fields(line); len(f) != 3 || !strings.HasPrefix(f[2], "sha256:") || len(f[2]) != 71 {
			t.Errorf("output line %q is not PATH SIZE sha256:HEX", line)
		}
	}
}

func checkRoot(t *testing.T, img string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "x")
	if out, err := exec.Command("fsck.erofs", "--extract="+dir, img).CombinedOutput(); err != nil {
		t.Fatalf("fsck.erofs: %v\n%s", err, out)
	}
	osRelease, err := os.ReadFile(filepath.Join(dir, "etc/os-release"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`NAME="Tether Example"`, "ID=tether-example", "VERSION_ID=1"} {
		if !strings.Contains(string(osRelease), want+"\n") {
			t.Errorf("/etc/os-release lacks %s:\n%s", want, osRelease)
		}
	}
	inittab, err := os.ReadFile(filepath.Join(dir, "etc/inittab"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(inittab), "::respawn:/usr/libexec/tether/run-agent\n") {
		t.Errorf("inittab does not respawn the agent:\n%s", inittab)
	}
	runAgent, err := os.ReadFile(filepath.Join(dir, "usr/libexec/tether/run-agent"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(runAgent), `exec "$agent" --root-mode=none --state-dir="$state"`) ||
		!strings.Contains(string(runAgent), "agent=/run/tether/bin/tether-agent") {
		t.Errorf("run-agent does not start /run/tether/bin/tether-agent --root-mode=none --state-dir=/run/tether:\n%s", runAgent)
	}
	for path, target := range map[string]string{"sbin/init": "/bin/busybox", "bin/sh": "/bin/busybox"} {
		if got, err := os.Readlink(filepath.Join(dir, path)); err != nil || got != target {
			t.Errorf("%s -> %q (%v), want %s", path, got, err, target)
		}
	}
	for path, mode := range map[string]os.FileMode{
		"bin/busybox": 0o755, "etc/init.d/rcS": 0o755, "usr/libexec/tether/run-agent": 0o755, "etc/shadow": 0o600,
	} {
		fi, err := os.Stat(filepath.Join(dir, path))
		if err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v, %v; want mode %o", path, fi, err, mode)
		}
	}
	for _, d := range []string{"dev", "proc", "sys", "run", "tmp"} {
		if fi, err := os.Stat(filepath.Join(dir, d)); err != nil || !fi.IsDir() {
			t.Errorf("mount point /%s missing: %v", d, err)
		}
	}
}
