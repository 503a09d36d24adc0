package ca_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"testing"

	"github.com/tetherfleet/tether/pki/ca"
)

// FuzzCSR feeds untrusted bytes through everything Enroll does with a CSR
// before signing: parse, signature check, node policy. It must never
// panic, and anything the policy accepts must be an Ed25519 request that
// names nothing but the instance.
func FuzzCSR(f *testing.F) {
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	der, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	f.Add(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
	f.Add(der)
	f.Add([]byte("-----BEGIN CERTIFICATE REQUEST-----\nZ2FyYmFnZQ==\n-----END CERTIFICATE REQUEST-----\n"))
	f.Add([]byte{0x30, 0x82, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		csr, err := ca.ParseCSR(data)
		if err != nil {
			return
		}
		if err := ca.CheckNodeCSR(csr, "i-1"); err != nil {
			return
		}
		if _, ok := csr.PublicKey.(ed25519.PublicKey); !ok {
			t.Fatalf("policy accepted a %T key", csr.PublicKey)
		}
		if len(csr.DNSNames)+len(csr.IPAddresses)+len(csr.EmailAddresses) > 0 {
			t.Fatal("policy accepted extra names")
		}
		for _, u := range csr.URIs {
			if u.String() != "tether://instance/i-1" {
				t.Fatalf("policy accepted URI %s", u)
			}
		}
	})
}
