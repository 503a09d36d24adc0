package tpm

import (
	"crypto/ed25519"
	"crypto/rand"
	"testing"

	gattest "github.com/google/go-attestation/attest"

	"github.com/tetherfleet/tether/internal/testkit/swtpmtest"
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

// BenchmarkSignature is what a TLS handshake would pay to sign in the TPM
// (ADR 0023: the node's key stays in memory): one ECDSA P-256 signature by
// a TPM-resident key (a quote of the SHA-256 PCRs by the AK, which is
// that signature plus the TPM's own quote structure), against an Ed25519
// signature in memory.
func BenchmarkSignature(b *testing.B) {
	nonce := make([]byte, 32)
	b.Run("tpm-ecdsa-p256", func(b *testing.B) {
		sw := swtpmtest.Start(b)
		t, err := OpenChannel(sw.Dial(b), nil)
		if err != nil {
			b.Fatal(err)
		}
		defer t.Close()
		ak, err := t.newAK(gattest.ECDSA)
		if err != nil {
			b.Fatal(err)
		}
		defer ak.Close()
		for b.Loop() {
			if _, err := ak.ak.Quote(t.t, nonce, gattest.HashSHA256); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("memory-ed25519", func(b *testing.B) {
		_, key, _ := ed25519.GenerateKey(rand.Reader)
		for b.Loop() {
			ed25519.Sign(key, nonce)
		}
	})
}
