package initramfs

import (
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/agent/identity"
	"github.com/tetherfleet/tether/pki"
)

// The keys staged for the initramfs are what the agent reads back as its
// anchor from /etc/tether/signers.
func TestStageSignersReadsBackAsTheAnchor(t *testing.T) {
	dir := t.TempDir()
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	pemBytes, err := pki.SignerPublicPEM(pub)
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "signer.pub")
	if err := os.WriteFile(keyFile, pemBytes, 0o644); err != nil {
		t.Fatal(err)
	}
	staged := filepath.Join(dir, "stage", "etc", "tether", "signers")
	if err := StageSigners(staged, []string{keyFile}); err != nil {
		t.Fatal(err)
	}
	a, err := identity.DiscoverAnchor(identity.AnchorSources{CmdlinePath: filepath.Join(dir, "none"), FwCfgDir: filepath.Join(dir, "none"), KeysDir: staged})
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Signers) != 1 || a.Signers[0] != pki.SignerFingerprint(pub) {
		t.Fatalf("anchor = %v, want %s", a.Signers, pki.SignerFingerprint(pub))
	}

	bad := filepath.Join(dir, "not-a-key")
	if err := os.WriteFile(bad, []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := StageSigners(filepath.Join(dir, "other"), []string{bad}); err == nil || !strings.Contains(err.Error(), bad) {
		t.Fatalf("a private key file must fail the build naming it: %v", err)
	}
}
