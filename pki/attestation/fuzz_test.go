package attestation_test

import (
	"crypto/rand"
	"testing"

	"github.com/tetherfleet/tether/internal/testkit/swtpmtest"
	"github.com/tetherfleet/tether/pki/attestation"
)

// FuzzNewChallenge: whatever a machine sends as its EK and AK, the
// challenge is refused or made, never a panic.
func FuzzNewChallenge(f *testing.F) {
	f.Add([]byte{0x30, 0x82, 0x01, 0x22}, []byte{}, []byte{0x00, 0x01, 0x00, 0x0b}, []byte{0, 0}, []byte{0xff, 0x54, 0x43, 0x47}, []byte{0, 0x14, 0, 0x0b, 0, 1})
	f.Fuzz(func(t *testing.T, ek, ekCert, pub, data, att, sig []byte) {
		_, _, _ = attestation.NewChallenge(ek, ekCert, attestation.AKParams{Public: pub, CreateData: data, CreateAttestation: att, CreateSignature: sig}, rand.Reader)
	})
}

// FuzzVerifyEvidence: any quote, PCR values and event log are verified or
// refused, never a panic.
func FuzzVerifyEvidence(f *testing.F) {
	f.Add([]byte{0x00, 0x01, 0x00, 0x0b}, []byte{0xff, 0x54, 0x43, 0x47, 0x80, 0x18}, []byte{0, 0x14}, []byte{1, 2, 3}, uint8(4), []byte{})
	f.Fuzz(func(t *testing.T, pub, quote, sig, digest []byte, index uint8, log []byte) {
		ev := attestation.Evidence{Quotes: []attestation.Quote{{Quote: quote, Signature: sig}}, PCRs: []attestation.PCR{{Index: int(index), Digest: digest}}, EventLog: log}
		_, _ = attestation.VerifyEvidence(attestation.AKParams{Public: pub}, ev, []byte("nonce"))
	})
}

// FuzzReplayEventLog: any event log, of any shape, is replayed or
// refused, never a panic.
func FuzzReplayEventLog(f *testing.F) {
	f.Add(swtpmtest.EventLog([]swtpmtest.Event{{PCR: 4, Type: swtpmtest.EvIPL, Data: []byte("kernel")}}), []byte{})
	f.Add([]byte{}, make([]byte, 32))
	f.Fuzz(func(t *testing.T, log, digest []byte) {
		_, _ = attestation.ReplayEventLog(log, []attestation.PCR{{Index: 4, Digest: digest}})
	})
}
