package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// corruptBlob flips a byte in the middle of a stored module, as disk rot
// or an attacker with access to the data dir would.
func corruptBlob(t *testing.T, dataDir, digest string) {
	t.Helper()
	path := filepath.Join(dataDir, "blobs", "sha256", strings.TrimPrefix(digest, "sha256:"))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
