package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"debug/pe"
	"encoding/pem"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/internal/uki"
	"github.com/tetherfleet/tether/providers/qemu/qemutest"
)

// Debian's ovmf ships a Secure Boot firmware and a variable store whose
// PK, KEK and db hold its snakeoil key.
const (
	secbootCode  = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd"
	snakeoilVars = "/usr/share/OVMF/OVMF_VARS_4M.snakeoil.fd"
	snakeoilKey  = "/usr/share/ovmf/PkKek-1-snakeoil.key"
	snakeoilCert = "/usr/share/ovmf/PkKek-1-snakeoil.pem"
)

// A UKI signed with a key in the firmware's db boots under Secure Boot
// (the kernel says so) into Tether's agent; the same image unsigned, one
// signed by another key, and a signed one whose command line was edited
// afterwards are refused by the firmware, and no kernel starts.
func TestSignedUKIBootsUnderSecureBoot(t *testing.T) {
	a := requireVM(t)
	for _, p := range []string{secbootCode, snakeoilVars, snakeoilKey, snakeoilCert, uki.DefaultStub} {
		if _, err := os.Stat(p); err != nil {
			qemutest.SkipLoudly(t, "%s is missing (apt-get install ovmf systemd-boot-efi)", p)
		}
	}
	if _, err := exec.LookPath("openssl"); err != nil {
		qemutest.SkipLoudly(t, "openssl is missing (it decrypts Debian's snakeoil key)")
	}
	tools, err := uki.FindTools(true)
	if err != nil {
		qemutest.SkipLoudly(t, "%v", err)
	}
	ctx := context.Background()
	dir := t.TempDir()
	dbKey := filepath.Join(dir, "db.key")
	if out, err := exec.Command("openssl", "pkey", "-in", snakeoilKey, "-passin", "pass:snakeoil", "-out", dbKey).CombinedOutput(); err != nil {
		t.Fatalf("decrypt the snakeoil key: %v: %s", err, out)
	}
	otherKey, otherCert := otherSigner(t, dir)

	spec := uki.Spec{Kernel: a.kernel, Initramfs: a.initramfs,
		Cmdline: "console=ttyS0,115200 tether.url=https://10.0.2.2:7443 tether.ca=sha256:" + strings.Repeat("ab", 32)}
	unsigned := filepath.Join(dir, "unsigned.efi")
	if err := uki.Build(ctx, tools, spec, unsigned); err != nil {
		t.Fatal(err)
	}
	signed, byOther := filepath.Join(dir, "signed.efi"), filepath.Join(dir, "other.efi")
	if err := uki.Sign(ctx, tools, uki.Signer{Key: dbKey, Cert: snakeoilCert}, unsigned, signed); err != nil {
		t.Fatal(err)
	}
	if err := uki.Sign(ctx, tools, uki.Signer{Key: otherKey, Cert: otherCert}, unsigned, byOther); err != nil {
		t.Fatal(err)
	}
	edited := filepath.Join(dir, "edited.efi")
	editCmdline(t, signed, edited, "10.0.2.2", "10.6.6.6")

	tests := []struct {
		name, image string
		boots       bool
	}{
		{"signed with the db key", signed, true},
		{"unsigned", unsigned, false},
		{"signed with another key", byOther, false},
		{"command line edited after signing", edited, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			console := bootSecure(t, tc.image)
			wctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
			defer cancel()
			if tc.boots {
				if _, err := qemutest.WaitForLine(wctx, console, "secureboot: Secure boot enabled", 1); err != nil {
					t.Fatalf("%v\n%s", err, consoleTail(console))
				}
				if _, err := qemutest.WaitForLine(wctx, console, "tether-agent: phase discovering", 1); err != nil {
					t.Fatalf("the agent did not start: %v\n%s", err, consoleTail(console))
				}
				return
			}
			if _, err := qemutest.WaitForLine(wctx, console, "Access Denied", 1); err != nil {
				t.Fatalf("the firmware did not refuse the image: %v\n%s", err, consoleTail(console))
			}
			if l := qemutest.Lines(console, "Linux version"); len(l) > 0 {
				t.Fatalf("a refused image started a kernel: %s", l[0])
			}
		})
	}
}

// bootSecure starts QEMU with the Secure Boot firmware and image as the
// removable-media loader of an ESP, and returns its console file. QEMU is
// killed when the test ends.
func bootSecure(t *testing.T, image string) string {
	t.Helper()
	qemu := qemutest.RequireQEMU(t)
	dir := t.TempDir()
	esp := filepath.Join(dir, "esp", "EFI", "BOOT")
	if err := os.MkdirAll(esp, 0o755); err != nil {
		t.Fatal(err)
	}
	img, err := os.ReadFile(image)
	if err != nil {
		t.Fatal(err)
	}
	vars, err := os.ReadFile(snakeoilVars)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(esp, "BOOTX64.EFI"), img, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "vars.fd"), vars, 0o644); err != nil {
		t.Fatal(err)
	}
	console := filepath.Join(dir, "console.log")
	cmd := exec.Command(qemu, "-machine", "q35,smm=on", "-accel", "tcg", "-m", "1024",
		"-global", "driver=cfi.pflash01,property=secure,value=on",
		"-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+secbootCode,
		"-drive", "if=pflash,format=raw,unit=1,file="+filepath.Join(dir, "vars.fd"),
		"-drive", "format=raw,file=fat:rw:"+filepath.Join(dir, "esp"),
		"-display", "none", "-monitor", "none", "-net", "none", "-serial", "file:"+console)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() && stderr.Len() > 0 {
			t.Logf("qemu: %s", stderr.String())
		}
	})
	return console
}

// otherSigner makes an RSA key and a self-signed certificate that no
// firmware store holds.
func otherSigner(t *testing.T, dir string) (keyFile, certFile string) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "not in db"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyFile, certFile = filepath.Join(dir, "other.key"), filepath.Join(dir, "other.crt")
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600)
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	return keyFile, certFile
}

// editCmdline copies a signed image with from replaced by to (same
// length) inside its .cmdline section, as an attacker on the path would.
func editCmdline(t *testing.T, in, out, from, to string) {
	t.Helper()
	f, err := pe.Open(in)
	if err != nil {
		t.Fatal(err)
	}
	s := f.Section(".cmdline")
	f.Close()
	if s == nil {
		t.Fatal("no .cmdline section")
	}
	b, err := os.ReadFile(in)
	if err != nil {
		t.Fatal(err)
	}
	sec := b[s.Offset : s.Offset+s.Size]
	i := bytes.Index(sec, []byte(from))
	if i < 0 || len(from) != len(to) {
		t.Fatalf("cannot edit %q in the command line %q", from, sec)
	}
	copy(sec[i:], to)
	if err := os.WriteFile(out, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func consoleTail(path string) string {
	b, _ := os.ReadFile(path)
	return tail(string(b), 3000)
}
