package modules

import (
	"crypto/ed25519"
	"crypto/rand"
	"testing"

	"github.com/tetherfleet/tether/agent/enroll/enrolltest"
	"github.com/tetherfleet/tether/pki"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// BenchmarkCheckSignatures is the per-module cost of the signing policy on
// the node: one module with an anchored signer and a required signer (two
// Ed25519 verifications). The target is well under 1 ms per module.
func BenchmarkCheckSignatures(b *testing.B) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	d := enrolltest.Digest([]byte("a"))
	m := &tetherv1.Module{Name: "a", Version: "1", Digest: d, Signatures: []*tetherv1.ModuleSignature{
		{Signer: pki.SignerFingerprint(pub), PublicKey: pub, Signature: pki.SignModule(priv, "a", "1", d)}}}
	asg := &tetherv1.Assignment{RootModules: []*tetherv1.Module{m}, RequiredSigners: []string{pki.SignerFingerprint(pub)}}
	p := Policy{Anchors: []string{pki.SignerFingerprint(pub)}}
	b.ReportAllocs()
	for b.Loop() {
		if err := CheckSignatures(asg, p); err != nil {
			b.Fatal(err)
		}
	}
}
