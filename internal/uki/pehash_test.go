package uki

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
	"path/filepath"
	"testing"
	"time"
)

// signer makes a throwaway db key and certificate.
func signer(t *testing.T, dir string) Signer {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test db"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	s := Signer{Key: filepath.Join(dir, "db.key"), Cert: filepath.Join(dir, "db.crt")}
	os.WriteFile(s.Key, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600)
	os.WriteFile(s.Cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	return s
}

// signedDigest is the image digest sbsign put in the signature: the
// DigestInfo of the SpcIndirectDataContent, the first SHA-256 algorithm
// identifier followed by a 32-byte octet string in the certificate table.
func signedDigest(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := pe.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dir := f.OptionalHeader.(*pe.OptionalHeader64).DataDirectory[securityDir]
	table := b[dir.VirtualAddress : dir.VirtualAddress+dir.Size]
	marker := []byte{0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05, 0x00, 0x04, 0x20}
	i := bytes.Index(table, marker)
	if i < 0 {
		t.Fatal("no SHA-256 digest in the signature")
	}
	return table[i+len(marker) : i+len(marker)+32]
}

// PEHash is the digest the signer signed (sbsign computes it on its own),
// and it changes with any byte of a section.
func TestPEHashIsTheAuthenticodeDigest(t *testing.T) {
	tl := tools(t, true)
	dir, kernel, initrd := inputs(t)
	unsigned, signed := filepath.Join(dir, "u.efi"), filepath.Join(dir, "s.efi")
	if err := Build(context.Background(), tl, Spec{Kernel: kernel, Initramfs: initrd, Cmdline: "console=ttyS0"}, unsigned); err != nil {
		t.Fatal(err)
	}
	if err := Sign(context.Background(), tl, signer(t, dir), unsigned, signed); err != nil {
		t.Fatal(err)
	}
	hu, err := PEHash(unsigned)
	if err != nil {
		t.Fatal(err)
	}
	hs, err := PEHash(signed)
	if err != nil {
		t.Fatal(err)
	}
	if want := signedDigest(t, signed); !bytes.Equal(hs, want) {
		t.Fatalf("PEHash %x, sbsign signed %x", hs, want)
	}
	// One byte of the kernel section, edited.
	f, _ := pe.Open(unsigned)
	off := f.Section(".linux").Offset
	f.Close()
	b, _ := os.ReadFile(unsigned)
	b[off+100] ^= 1
	edited := filepath.Join(dir, "e.efi")
	os.WriteFile(edited, b, 0o644)
	if he, _ := PEHash(edited); bytes.Equal(he, hu) {
		t.Fatal("an edited section hashes the same")
	}
}

func TestPEHashRefuses(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string][]byte{
		"empty":        nil,
		"not MZ":       bytes.Repeat([]byte{0}, 128),
		"no PE header": append([]byte("MZ"), make([]byte, 126)...),
	} {
		p := filepath.Join(dir, "x")
		os.WriteFile(p, content, 0o644)
		if _, err := PEHash(p); err == nil {
			t.Errorf("%s: hashed", name)
		}
	}
	if _, err := PEHash(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing file hashed")
	}
}
