package ca_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/pki"
	"github.com/tetherfleet/tether/pki/ca"
)

func newCA(t *testing.T) (*ca.CA, string, *clock.Fake) {
	t.Helper()
	dir := t.TempDir()
	clk := clock.NewFake(time.Now())
	c, err := ca.Create(dir, "Tether test CA", clk)
	if err != nil {
		t.Fatal(err)
	}
	return c, dir, clk
}

func csrFor(t *testing.T, key crypto.Signer, cn string, uris ...string) *x509.CertificateRequest {
	t.Helper()
	tpl := &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn}}
	for _, u := range uris {
		parsed, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tpl.URIs = append(tpl.URIs, parsed)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tpl, key)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		t.Fatal(err)
	}
	return csr
}

func TestCreateRefusesToOverwrite(t *testing.T) {
	_, dir, clk := newCA(t)
	before, _ := os.ReadFile(filepath.Join(dir, ca.KeyFile))
	if _, err := ca.Create(dir, "again", clk); !errors.Is(err, ca.ErrExists) {
		t.Fatalf("second Create: got %v, want ErrExists", err)
	}
	after, _ := os.ReadFile(filepath.Join(dir, ca.KeyFile))
	if string(before) != string(after) {
		t.Fatal("the CA key changed")
	}
	st, err := os.Stat(filepath.Join(dir, ca.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("CA key mode %v, want 0600", st.Mode().Perm())
	}
}

func TestSignNode(t *testing.T) {
	c, _, clk := newCA(t)
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	const id = "0190f1c2-0000-7000-8000-000000000001"

	tests := []struct {
		name    string
		csr     *x509.CertificateRequest
		wantErr error
	}{
		{"bare CSR", csrFor(t, edKey, ""), nil},
		{"names its own instance", csrFor(t, edKey, id, "tether://instance/"+id), nil},
		{"ECDSA key", csrFor(t, ecKey, ""), ca.ErrCSRKeyType},
		{"RSA key", csrFor(t, rsaKey, ""), ca.ErrCSRKeyType},
		{"another instance", csrFor(t, edKey, "", "tether://instance/other"), ca.ErrCSRNames},
		{"admin identity", csrFor(t, edKey, "", "tether://admin/root"), ca.ErrCSRNames},
		{"foreign common name", csrFor(t, edKey, "root"), ca.ErrCSRNames},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cert, err := c.SignNode(context.Background(), tc.csr, id, 0)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("got %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := c.Verify(cert, x509.ExtKeyUsageClientAuth)
			if err != nil {
				t.Fatal(err)
			}
			if got.Kind != pki.KindInstance || got.Name != id {
				t.Fatalf("identity %+v", got)
			}
			// Certificates carry whole seconds.
			if d := cert.NotAfter.Sub(clk.Now()); d <= ca.DefaultNodeLifetime-time.Second || d > ca.DefaultNodeLifetime {
				t.Fatalf("lifetime %v, want 24h", d)
			}
			if len(cert.ExtKeyUsage) != 1 || cert.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth {
				t.Fatalf("node certificate usages %v, want client auth only", cert.ExtKeyUsage)
			}
		})
	}
}

func TestLifetimePolicy(t *testing.T) {
	c, _, _ := newCA(t)
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	if _, err := c.SignNode(context.Background(), csrFor(t, edKey, ""), "i1", 30*24*time.Hour); err == nil {
		t.Fatal("a 30-day node certificate was signed")
	}
}

func TestVerifyExpiredAndForeign(t *testing.T) {
	c, _, clk := newCA(t)
	other, _, _ := newCA(t)
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	cert, err := c.SignNode(context.Background(), csrFor(t, edKey, ""), "i1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Verify(cert, x509.ExtKeyUsageClientAuth); err == nil {
		t.Fatal("a certificate from another CA verified")
	}
	clk.Advance(2 * time.Hour)
	_, err = c.Verify(cert, x509.ExtKeyUsageClientAuth)
	if err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("expired certificate: %v", err)
	}
}

func TestAdminAndServer(t *testing.T) {
	c, _, _ := newCA(t)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	admin, err := c.SignAdmin("root", "admin", key.Public(), 0)
	if err != nil {
		t.Fatal(err)
	}
	id, err := c.Verify(admin, x509.ExtKeyUsageClientAuth)
	if err != nil || id.Kind != pki.KindAdmin || id.Role != "admin" {
		t.Fatalf("admin identity %+v, %v", id, err)
	}
	srv, err := c.SignServer([]string{"localhost", "127.0.0.1", "::1"}, key.Public())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Verify(x509.VerifyOptions{Roots: c.Pool(), DNSName: "127.0.0.1"}); err != nil {
		t.Fatalf("server certificate does not verify by address: %v", err)
	}
}

// TestOpenSSLInterop: the CA works with openssl, and the fingerprint is what
// `openssl x509 -outform der | sha256sum` prints.
func TestOpenSSLInterop(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("SKIP: openssl not installed; cannot check interop")
	}
	c, dir, _ := newCA(t)
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	cert, err := c.SignNode(context.Background(), csrFor(t, edKey, ""), "i1", 0)
	if err != nil {
		t.Fatal(err)
	}
	leaf := filepath.Join(t.TempDir(), "node.crt")
	if err := os.WriteFile(leaf, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	caPath := filepath.Join(dir, ca.CertFile)
	out, err := exec.Command("openssl", "verify", "-purpose", "sslclient", "-CAfile", caPath, leaf).CombinedOutput()
	if err != nil {
		t.Fatalf("openssl verify: %v\n%s", err, out)
	}
	der, err := exec.Command("openssl", "x509", "-in", caPath, "-outform", "der").Output()
	if err != nil {
		t.Fatal(err)
	}
	if pki.Fingerprint(der) != c.Fingerprint() {
		t.Fatal("fingerprint differs from openssl's DER")
	}
}

// TestCAKeyTypes: a CA of either key type signs node, server and admin
// certificates that verify against it, and reloads from its directory.
func TestCAKeyTypes(t *testing.T) {
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	for _, tc := range []struct {
		flag string
		want x509.PublicKeyAlgorithm
	}{{"", x509.ECDSA}, {"p256", x509.ECDSA}, {"ed25519", x509.Ed25519}} {
		t.Run("ca-key="+tc.flag, func(t *testing.T) {
			kt, err := ca.ParseKeyType(tc.flag)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			clk := clock.NewFake(time.Now())
			c, err := ca.CreateWithKey(dir, "test", clk, kt)
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Certificate().PublicKeyAlgorithm; got != tc.want {
				t.Fatalf("CA key %s, want %s", got, tc.want)
			}
			node, err := c.SignNode(context.Background(), csrFor(t, edKey, ""), "i1", 0)
			if err != nil {
				t.Fatal(err)
			}
			reloaded, err := ca.Load(dir, clk)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := reloaded.Verify(node, x509.ExtKeyUsageClientAuth); err != nil {
				t.Fatalf("node certificate does not verify against the reloaded CA: %v", err)
			}
			srv, err := reloaded.SignServer([]string{"127.0.0.1"}, ecKey.Public())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := srv.Verify(x509.VerifyOptions{Roots: reloaded.Pool(), CurrentTime: clk.Now()}); err != nil {
				t.Fatalf("server certificate: %v", err)
			}
		})
	}
	if _, err := ca.ParseKeyType("rsa"); err == nil || !strings.Contains(err.Error(), "rsa") {
		t.Fatalf("ParseKeyType(rsa) = %v, want an error naming it", err)
	}
}
