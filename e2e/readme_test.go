package e2e

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestREADMETryItByHand runs e2e/readme.sh: the README's "Try it by hand"
// block as a user pastes it, on a real VM.
func TestREADMETryItByHand(t *testing.T) {
	requireVM(t)
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", filepath.Join(root, "e2e", "readme.sh"))
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if strings.Contains(string(out), "SKIP (README e2e)") {
		t.Skip(strings.TrimSpace(string(out)))
	}
	if err != nil || !strings.Contains(string(out), "the README block ran as written") {
		t.Fatalf("README block: %v\n%s", err, tail(string(out), 6000))
	}
}
