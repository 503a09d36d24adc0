package attestation_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/agent/tpm"
	"github.com/tetherfleet/tether/internal/testkit/swtpmtest"
	"github.com/tetherfleet/tether/pki/attestation"
)

// machine is a software TPM opened the way the agent opens one, with a
// firmware event log that replays to its PCRs.
type machine struct {
	tpm *tpm.TPM
	ek  tpm.EK
	log []byte
}

func newMachine(t testing.TB) *machine {
	t.Helper()
	sw := swtpmtest.Start(t)
	c := sw.Dial(t)
	log, err := swtpmtest.Measure(c, []swtpmtest.Event{
		{PCR: 4, Type: swtpmtest.EvIPL, Data: []byte("kernel")},
		{PCR: 9, Type: swtpmtest.EvIPL, Data: []byte("initramfs")},
	})
	c.Close()
	if err != nil {
		t.Fatal(err)
	}
	tp, err := tpm.OpenChannel(sw.Dial(t), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tp.Close() })
	ek, err := tp.EK()
	if err != nil {
		t.Fatal(err)
	}
	if ek.CertificateDER == nil {
		t.Fatal("swtpm's EK came without its certificate")
	}
	return &machine{tpm: tp, ek: ek, log: log}
}

// enrollment is one run of the protocol up to the proof.
type enrollment struct {
	ak     *tpm.AK
	params attestation.AKParams
	secret []byte // the control plane's
	got    []byte // what the TPM released
	nonce  []byte
	ev     attestation.Evidence
}

func (m *machine) enroll(t testing.TB, id string, csr []byte) *enrollment {
	t.Helper()
	ak, err := m.tpm.NewAK()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ak.Close() })
	p := ak.Params()
	c, secret, err := attestation.NewChallenge(m.ek.PublicDER, m.ek.CertificateDER, p, rand.Reader)
	if err != nil {
		t.Fatalf("NewChallenge: %v", err)
	}
	got, err := ak.Activate(c)
	if err != nil {
		t.Fatalf("Activate: %v", err)
	}
	nonce := attestation.Nonce(id, got, csr)
	ev, err := ak.Quote(nonce)
	if err != nil {
		t.Fatalf("Quote: %v", err)
	}
	return &enrollment{ak: ak, params: p, secret: secret, got: got, nonce: nonce, ev: ev}
}

// TestAttestationEndToEnd: a TPM's AK is challenged, activates the
// credential, quotes with the enrollment's nonce, and the quote and event
// log verify; each way of getting it wrong is refused for its reason.
func TestAttestationEndToEnd(t *testing.T) {
	m := newMachine(t)
	csr := []byte("csr one")
	e := m.enroll(t, "enrollment-1", csr)
	if !bytes.Equal(e.got, e.secret) {
		t.Fatal("the TPM released another secret than the challenge's")
	}
	res, err := attestation.VerifyEvidence(e.params, e.ev, e.nonce)
	if err != nil {
		t.Fatalf("VerifyEvidence: %v", err)
	}
	if !res.EventLog || res.Events < 2 {
		t.Fatalf("result %+v, want the event log replayed with its 2 events at least", res)
	}

	other := newMachine(t)
	later := m.enroll(t, "enrollment-2", csr)

	flip := func(b []byte) []byte {
		c := bytes.Clone(b)
		c[len(c)-1] ^= 1
		return c
	}
	tests := []struct {
		name  string
		ak    attestation.AKParams
		ev    attestation.Evidence
		nonce []byte
		want  error
	}{
		{"a quote from an earlier enrollment", later.params, e.ev, later.nonce, attestation.ErrNonce},
		{"the nonce of another CSR", e.params, e.ev, attestation.Nonce("enrollment-1", e.got, []byte("csr two")), attestation.ErrNonce},
		{"a quote signed by another AK", e.params, later.ev, later.nonce, attestation.ErrBadQuote},
		{"a signature that does not verify", e.params, attestation.Evidence{Quotes: []attestation.Quote{{Quote: e.ev.Quotes[0].Quote, Signature: flip(e.ev.Quotes[0].Signature)}}, PCRs: e.ev.PCRs, EventLog: m.log}, e.nonce, attestation.ErrBadQuote},
		{"PCR values other than quoted", e.params, attestation.Evidence{Quotes: e.ev.Quotes, PCRs: withPCR(e.ev.PCRs, 4, bytes.Repeat([]byte{7}, 32)), EventLog: m.log}, e.nonce, attestation.ErrBadQuote},
		{"an event log that does not replay", e.params, attestation.Evidence{Quotes: e.ev.Quotes, PCRs: e.ev.PCRs,
			EventLog: swtpmtest.EventLog([]swtpmtest.Event{{PCR: 4, Type: swtpmtest.EvIPL, Data: []byte("another kernel")}, {PCR: 9, Type: swtpmtest.EvIPL, Data: []byte("initramfs")}})}, e.nonce, attestation.ErrEventLog},
		{"an event log that is not one", e.params, attestation.Evidence{Quotes: e.ev.Quotes, PCRs: e.ev.PCRs, EventLog: []byte("not a log at all, but long enough to be read as one")}, e.nonce, attestation.ErrMalformed},
		{"an oversized event log", e.params, attestation.Evidence{Quotes: e.ev.Quotes, PCRs: e.ev.PCRs, EventLog: make([]byte, attestation.MaxEventLogBytes+1)}, e.nonce, attestation.ErrTooLarge},
		{"no quote", e.params, attestation.Evidence{PCRs: e.ev.PCRs}, e.nonce, attestation.ErrMalformed},
		{"a quote that is no TPM structure", e.params, attestation.Evidence{Quotes: []attestation.Quote{{Quote: []byte("junk"), Signature: []byte("junk")}}, PCRs: e.ev.PCRs}, e.nonce, attestation.ErrMalformed},
		{"a PCR of the wrong size", e.params, attestation.Evidence{Quotes: e.ev.Quotes, PCRs: withPCR(e.ev.PCRs, 4, []byte{1})}, e.nonce, attestation.ErrMalformed},
		{"an AK public area that is no TPM structure", attestation.AKParams{Public: []byte("junk")}, e.ev, e.nonce, attestation.ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := attestation.VerifyEvidence(tt.ak, tt.ev, tt.nonce)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}

	t.Run("activation by another TPM", func(t *testing.T) {
		// The credential is encrypted to m's EK: other's TPM cannot
		// release it, even for a key whose parameters it was sent.
		c, _, err := attestation.NewChallenge(m.ek.PublicDER, m.ek.CertificateDER, later.params, rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		oak, err := other.tpm.NewAK()
		if err != nil {
			t.Fatal(err)
		}
		defer oak.Close()
		if got, err := oak.Activate(c); err == nil {
			t.Fatalf("another TPM activated the credential (%x)", got)
		}
	})
	t.Run("a challenge answered twice", func(t *testing.T) {
		// The secret of one challenge is not the secret of the next: an
		// activation replayed into a later enrollment compares unequal.
		_, s2, err := attestation.NewChallenge(m.ek.PublicDER, m.ek.CertificateDER, later.params, rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(s2, later.secret) {
			t.Fatal("two challenges share a secret")
		}
	})
}

func withPCR(pcrs []attestation.PCR, index int, digest []byte) []attestation.PCR {
	out := make([]attestation.PCR, len(pcrs))
	copy(out, pcrs)
	for i := range out {
		if out[i].Index == index {
			out[i].Digest = digest
		}
	}
	return out
}

// TestNewChallengeRefusals: an AK or EK that is not what it claims is
// refused before any credential is made.
func TestNewChallengeRefusals(t *testing.T) {
	m := newMachine(t)
	other := newMachine(t)
	ak, err := m.tpm.NewAK()
	if err != nil {
		t.Fatal(err)
	}
	defer ak.Close()
	good := ak.Params()
	tamper := func(f func(p *attestation.AKParams)) attestation.AKParams {
		p := attestation.AKParams{Public: bytes.Clone(good.Public), CreateData: bytes.Clone(good.CreateData),
			CreateAttestation: bytes.Clone(good.CreateAttestation), CreateSignature: bytes.Clone(good.CreateSignature)}
		f(&p)
		return p
	}
	tests := []struct {
		name   string
		ek     []byte
		ekCert []byte
		ak     attestation.AKParams
		want   error
	}{
		{"EK certificate of another TPM", m.ek.PublicDER, other.ek.CertificateDER, good, attestation.ErrEKCertMismatch},
		{"EK certificate that is no certificate", m.ek.PublicDER, []byte("junk"), good, attestation.ErrMalformed},
		{"EK that is no key", []byte("junk"), nil, good, attestation.ErrMalformed},
		{"oversized EK", make([]byte, attestation.MaxEKBytes+1), nil, good, attestation.ErrTooLarge},
		{"AK whose creation data was changed", m.ek.PublicDER, nil, tamper(func(p *attestation.AKParams) { p.CreateData[len(p.CreateData)-1] ^= 1 }), attestation.ErrBadAK},
		{"AK whose attestation was changed", m.ek.PublicDER, nil, tamper(func(p *attestation.AKParams) { p.CreateAttestation[len(p.CreateAttestation)-1] ^= 1 }), attestation.ErrBadAK},
		{"AK whose creation signature was changed", m.ek.PublicDER, nil, tamper(func(p *attestation.AKParams) { p.CreateSignature[len(p.CreateSignature)-1] ^= 1 }), attestation.ErrBadAK},
		{"AK attributes of an unrestricted key", m.ek.PublicDER, nil, tamper(func(p *attestation.AKParams) { clearRestricted(t, p.Public) }), attestation.ErrBadAK},
		{"AK with a missing part", m.ek.PublicDER, nil, tamper(func(p *attestation.AKParams) { p.CreateSignature = nil }), attestation.ErrMalformed},
		{"oversized AK", m.ek.PublicDER, nil, tamper(func(p *attestation.AKParams) { p.Public = make([]byte, attestation.MaxAKBytes+1) }), attestation.ErrTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, _, err := attestation.NewChallenge(tt.ek, tt.ekCert, tt.ak, rand.Reader); !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}
}

// clearRestricted clears the restricted bit of a TPMT_PUBLIC's
// objectAttributes (type u16, nameAlg u16, then attributes u32 big-endian;
// restricted is bit 16).
func clearRestricted(t *testing.T, pub []byte) {
	t.Helper()
	if len(pub) < 8 {
		t.Fatal("short public area")
	}
	pub[5] &^= 0x01
}

func TestEKHash(t *testing.T) {
	m := newMachine(t)
	h, err := attestation.EKHashDER(m.ek.PublicDER)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(h, "sha256:") || len(h) != 7+64 {
		t.Fatalf("hash %q", h)
	}
	if back, err := attestation.ParseEKHash(strings.ToUpper(h[7:])); err == nil {
		t.Fatalf("a hash without its prefix parsed as %q", back)
	}
	if back, err := attestation.ParseEKHash("sha256:" + strings.ToUpper(h[7:])); err != nil || back != h {
		t.Fatalf("ParseEKHash(upper) = %q, %v; want %q", back, err, h)
	}
	for _, bad := range []string{"", "sha256:", "sha256:" + strings.Repeat("g", 64), "sha1:" + strings.Repeat("a", 40), "sha256:" + strings.Repeat("a", 63)} {
		if _, err := attestation.ParseEKHash(bad); err == nil {
			t.Errorf("ParseEKHash(%q) accepted", bad)
		}
	}
}
