package ca_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
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
