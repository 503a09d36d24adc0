package certreload

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tetherfleet/tether/internal/clock"
)

var now = time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)

// pair writes a self-signed certificate valid until notAfter and its key.
func pair(t *testing.T, dir string, serial int64, notAfter time.Time) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "tetherd"},
		NotBefore: now.Add(-time.Hour), NotAfter: notAfter}, &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "tetherd"}}, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	write(t, filepath.Join(dir, "server.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}))
	write(t, filepath.Join(dir, "server.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func write(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

func serial(r *Reloader) int64 {
	c, _ := r.GetCertificate(nil)
	return c.Leaf.SerialNumber.Int64()
}

func TestReloader(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	pair(t, dir, 1, now.Add(365*24*time.Hour))
	r, err := New(filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key"), clock.NewFake(now), log)
	if err != nil {
		t.Fatal(err)
	}
	if changed, err := r.Check(); changed || err != nil {
		t.Fatalf("Check of unchanged files = %v, %v; want no reload", changed, err)
	}

	pair(t, dir, 2, now.Add(365*24*time.Hour))
	if changed, err := r.Check(); !changed || err != nil || serial(r) != 2 {
		t.Fatalf("Check after a renewal = %v, %v, serial %d; want serial 2 in service", changed, err, serial(r))
	}

	tests := []struct {
		name  string
		spoil func()
	}{
		{"a key that does not match", func() {
			key, _ := os.ReadFile(filepath.Join(dir, "server.key"))
			pair(t, dir, 3, now.Add(365*24*time.Hour))
			write(t, filepath.Join(dir, "server.key"), key)
		}},
		{"a half-written certificate", func() { write(t, filepath.Join(dir, "server.crt"), []byte("-----BEGIN CERTIFICATE-----\nMIIB")) }},
		{"an expired certificate", func() { pair(t, dir, 4, now.Add(-time.Minute)) }},
		{"a missing key", func() { os.Remove(filepath.Join(dir, "server.key")) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pair(t, dir, 2, now.Add(365*24*time.Hour)) // back to a good pair
			if _, err := r.Reload(); err != nil {
				t.Fatal(err)
			}
			tc.spoil()
			if _, err := r.Reload(); err == nil {
				t.Fatal("a bad pair loaded")
			}
			if serial(r) != 2 {
				t.Fatalf("serial %d in service after a failed reload, want the old one (2)", serial(r))
			}
		})
	}
}
