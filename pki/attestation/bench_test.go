package attestation_test

import (
	"crypto/rand"
	"testing"

	"github.com/tetherfleet/tether/pki/attestation"
)

// BenchmarkAttestationSteps is where the control plane's time in an
// attested enrollment goes, step by step, on material one swtpm made:
// the challenge (AK checks and the credential encrypted to the EK), the
// quote's verification, and the event log's replay.
func BenchmarkAttestationSteps(b *testing.B) {
	m := newMachine(b)
	e := m.enroll(b, "bench", []byte("csr"))
	b.Run("challenge", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := attestation.NewChallenge(m.ek.PublicDER, m.ek.CertificateDER, e.params, rand.Reader); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("verify-quote-and-log", func(b *testing.B) {
		for b.Loop() {
			if _, err := attestation.VerifyEvidence(e.params, e.ev, e.nonce); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("replay-log", func(b *testing.B) {
		for b.Loop() {
			if _, err := attestation.ReplayEventLog(e.ev.EventLog, e.ev.PCRs); err != nil {
				b.Fatal(err)
			}
		}
	})
}
