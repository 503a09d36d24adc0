package tetherctl_test

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/internal/uki"
)

// bootimage build -o json reports what tetherd will expect the firmware
// to measure (PCR 4), and that is the signed file's Authenticode digest.
func TestBootimageBuildReportsTheMeasuredDigest(t *testing.T) {
	if _, err := uki.FindTools(true); err != nil {
		os.Stderr.WriteString("SKIPPING " + t.Name() + ": " + err.Error() + "\n")
		t.Skip(err)
	}
	if _, err := os.Stat(uki.DefaultStub); err != nil {
		os.Stderr.WriteString("SKIPPING " + t.Name() + ": no systemd-boot-efi stub\n")
		t.Skip(err)
	}
	dir := t.TempDir()
	kernel, initrd := filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initrd")
	os.WriteFile(kernel, bytes.Repeat([]byte("K"), 5000), 0o644)
	os.WriteFile(initrd, bytes.Repeat([]byte("I"), 3000), 0o644)
	key, _ := rsa.GenerateKey(rand.Reader, 2048)
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "db"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, _ := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	k, c := filepath.Join(dir, "db.key"), filepath.Join(dir, "db.crt")
	os.WriteFile(k, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600)
	os.WriteFile(c, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	out := filepath.Join(dir, "node.efi")
	stdout, stderr, code := run(t, "-o", "json", "bootimage", "build", "--kernel", kernel, "--initramfs", initrd, "--url", "https://10.0.2.2:7443",
		"--ca", "sha256:"+strings.Repeat("ab", 32), "--handoff", "http://10.0.2.2:8080", "--key", k, "--cert", c, "--out", out)
	if code != 0 {
		t.Fatalf("exit %d: %s %s", code, stdout, stderr)
	}
	var img struct {
		Measured string `json:"measured_digest"`
		Cmdline  string `json:"cmdline"`
		Signed   bool   `json:"signed"`
	}
	if err := json.Unmarshal([]byte(stdout), &img); err != nil {
		t.Fatalf("%v: %s", err, stdout)
	}
	h, err := uki.PEHash(out)
	if err != nil {
		t.Fatal(err)
	}
	if img.Measured != "sha256:"+hex.EncodeToString(h) || !img.Signed || !strings.Contains(img.Cmdline, "tether.handoff=http://10.0.2.2:8080 ip=dhcp") {
		t.Fatalf("reported %+v, want measured sha256:%x, signed, the hand-off on the command line", img, h)
	}
}
