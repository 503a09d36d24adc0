package ca_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"testing"
	"time"

	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/pki/ca"
)

// BenchmarkSignNode is the CPU cost of one node certificate: policy,
// CSR signature check, template, name policy, ECDSA P-256 signature.
func BenchmarkSignNode(b *testing.B) {
	c, err := ca.Create(b.TempDir(), "bench", clock.NewFake(time.Now()))
	if err != nil {
		b.Fatal(err)
	}
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	der, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	csr, _ := x509.ParseCertificateRequest(der)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.SignNode(context.Background(), csr, "0190f1c2-0000-7000-8000-000000000001", 0); err != nil {
			b.Fatal(err)
		}
	}
}
