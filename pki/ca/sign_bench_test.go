package ca_test

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/pki/ca"
)

// BenchmarkSignNode is the CPU cost of one node certificate: policy,
// CSR signature check, name policy, the CA's signature (and the check of
// it crypto/x509 makes), for each CA key type.
func BenchmarkSignNode(b *testing.B) {
	for _, kt := range []ca.KeyType{ca.KeyP256, ca.KeyEd25519} {
		b.Run("ca="+string(kt), func(b *testing.B) {
			c, err := ca.CreateWithKey(b.TempDir(), "bench", clock.NewFake(time.Now()), kt)
			if err != nil {
				b.Fatal(err)
			}
			_, key, _ := ed25519.GenerateKey(rand.Reader)
			der, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
			csr, _ := x509.ParseCertificateRequest(der)
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuTime()
			for i := 0; i < b.N; i++ {
				if _, err := c.SignNode(context.Background(), csr, "0190f1c2-0000-7000-8000-000000000001", 0); err != nil {
					b.Fatal(err)
				}
			}
			// CPU rather than wall time: on a shared machine ns/op counts
			// the time others held the core.
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkSignWithoutAuthority measures what signing a node certificate
// would cost with crypto/x509 alone (one CSR check, the signature and the
// check crypto/x509 makes of it, parsing the result): the saving a
// SignNode without smallstep's authority could make. Not the code path.
func BenchmarkSignWithoutAuthority(b *testing.B) {
	for _, kt := range []ca.KeyType{ca.KeyP256, ca.KeyEd25519} {
		b.Run("ca="+string(kt), func(b *testing.B) {
			dir := b.TempDir()
			c, err := ca.CreateWithKey(dir, "bench", clock.NewFake(time.Now()), kt)
			if err != nil {
				b.Fatal(err)
			}
			keyPEM, err := os.ReadFile(filepath.Join(dir, ca.KeyFile))
			if err != nil {
				b.Fatal(err)
			}
			blk, _ := pem.Decode(keyPEM)
			k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
			if err != nil {
				b.Fatal(err)
			}
			signer := k.(crypto.Signer)
			_, key, _ := ed25519.GenerateKey(rand.Reader)
			der, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
			csr, _ := x509.ParseCertificateRequest(der)
			uri, _ := url.Parse("tether://instance/0190f1c2-0000-7000-8000-000000000001")
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuTime()
			for i := 0; i < b.N; i++ {
				if err := csr.CheckSignature(); err != nil {
					b.Fatal(err)
				}
				serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
				now := time.Now()
				out, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: serial, URIs: []*url.URL{uri},
					NotBefore: now.Add(-time.Minute), NotAfter: now.Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
					ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, c.Certificate(), csr.PublicKey, signer)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := x509.ParseCertificate(out); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}
