package identity

import (
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/pki"
)

func TestDiscoverAnchor(t *testing.T) {
	fp := func() string {
		pub, _, _ := ed25519.GenerateKey(rand.Reader)
		return pki.SignerFingerprint(pub)
	}
	a, b := fp(), fp()
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	baked := pki.SignerFingerprint(pub)
	pubPEM, _ := pki.SignerPublicPEM(pub)
	write := func(t *testing.T, p, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name    string
		cmdline string
		fwcfg   string
		key     string
		want    []string
		wantErr string
	}{
		{"none", "console=ttyS0", "", "", nil, ""},
		{"cmdline", "tether.signers=" + a + "," + strings.ToUpper(b[7:]), "", "", []string{a, b}, ""},
		{"fw_cfg", "", a + "\n", "", []string{a}, ""},
		{"initramfs key", "", "", string(pubPEM), []string{baked}, ""},
		{"every source joins", "tether.signers=" + a, b, string(pubPEM), []string{a, b, baked}, ""},
		{"given twice on the command line, joined", "tether.signers=" + a + " tether.signers=" + b, "", "", []string{a, b}, ""},
		{"duplicates once", "tether.signers=" + a + "," + a, a, "", []string{a}, ""},
		{"bad cmdline fingerprint", "tether.signers=sha256:1234", "", "", nil, "tether.signers"},
		{"empty cmdline value", "tether.signers=", "", "", nil, "tether.signers"},
		{"bad fw_cfg", "", "nope", "", nil, "signers/raw"},
		{"bad key file", "", "", "junk", nil, "x.pub"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			src := AnchorSources{CmdlinePath: filepath.Join(dir, "cmdline"), FwCfgDir: filepath.Join(dir, "fw"), KeysDir: filepath.Join(dir, "keys")}
			write(t, src.CmdlinePath, tt.cmdline)
			if tt.fwcfg != "" {
				write(t, filepath.Join(src.FwCfgDir, "signers", "raw"), tt.fwcfg)
			}
			if tt.key != "" {
				write(t, filepath.Join(src.KeysDir, "x.pub"), tt.key)
			}
			got, err := DiscoverAnchor(src)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(got.Signers, ",") != strings.Join(tt.want, ",") {
				t.Fatalf("anchor = %v, want %v", got.Signers, tt.want)
			}
		})
	}
}
