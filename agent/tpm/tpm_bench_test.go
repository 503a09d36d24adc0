package tpm

import (
	"testing"

	gattest "github.com/google/go-attestation/attest"

	"github.com/tetherfleet/tether/internal/swtpmtest"
)

// BenchmarkNewAK is what choosing the AK's algorithm costs a boot, on
// swtpm (a hardware TPM is slower still at RSA).
func BenchmarkNewAK(b *testing.B) {
	for _, alg := range []gattest.Algorithm{gattest.ECDSA, gattest.RSA} {
		b.Run(string(alg), func(b *testing.B) {
			sw := swtpmtest.Start(b)
			t, err := OpenChannel(sw.Dial(b), nil)
			if err != nil {
				b.Fatal(err)
			}
			defer t.Close()
			for b.Loop() {
				ak, err := t.newAK(alg)
				if err != nil {
					b.Fatal(err)
				}
				ak.Close()
			}
		})
	}
}
