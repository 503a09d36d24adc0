// Package attestation verifies a TPM 2.0 attested enrollment on the control
// plane's side (docs/adr/0023): it makes the credential-activation
// challenge for an attestation key, binds the quote to one enrollment, and
// checks the quote and the event log. It talks to no TPM; go-attestation
// does the TPM structures.
package attestation

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"

	gattest "github.com/google/go-attestation/attest"
	"github.com/google/go-tpm/legacy/tpm2"
)

// Limits on what a machine may send, checked before anything is parsed. A
// TPM's structures are a few hundred bytes; a firmware event log with
// Secure Boot databases measured is tens of KiB.
const (
	MaxEKBytes       = 4 << 10
	MaxAKBytes       = 4 << 10
	MaxQuoteBytes    = 8 << 10
	MaxQuotes        = 4
	MaxEventLogBytes = 1 << 20
	// PCRs in the SHA-256 bank.
	MaxPCRs = 24
)

// The reasons an attestation is refused. Every error this package returns
// wraps one, so that a caller can map it to a status and write one event
// per reason.
var (
	ErrTooLarge       = errors.New("too large")
	ErrMalformed      = errors.New("malformed TPM structure")
	ErrBadAK          = errors.New("attestation key unfit")
	ErrEKCertMismatch = errors.New("EK certificate does not match the EK")
	ErrBadActivation  = errors.New("credential not activated")
	ErrBadQuote       = errors.New("quote does not verify")
	ErrNonce          = errors.New("quote is not for this enrollment")
	ErrEventLog       = errors.New("event log does not replay to the quoted PCRs")
)

// AKParams is a TPM 2.0 attestation key as its TPM describes it: the
// TPMT_PUBLIC area, and the TPMS_CREATION_DATA, TPMS_ATTEST and
// TPMT_SIGNATURE of its creation.
type AKParams struct {
	Public, CreateData, CreateAttestation, CreateSignature []byte
}

// Challenge is a credential encrypted to an EK and bound to an AK's name.
type Challenge struct {
	Credential, Secret []byte
}

// Quote is a TPMS_ATTEST of type quote and its TPMT_SIGNATURE.
type Quote struct {
	Quote, Signature []byte
}

// PCR is one register of the SHA-256 bank.
type PCR struct {
	Index  int
	Digest []byte
}

// Evidence is what a machine returns with its activated secret.
type Evidence struct {
	Quotes   []Quote
	PCRs     []PCR
	EventLog []byte
}

// Result is what a verified attestation showed.
type Result struct {
	// Events is how many events of the log were replayed.
	Events int
	// EventLog is false when the machine sent none (a VM booted straight
	// into its kernel has no firmware that measures).
	EventLog bool
}

// ekHashPrefix names the one algorithm an EK hash uses.
const ekHashPrefix = "sha256:"

// EKHash is "sha256:" and the hex SHA-256 of the key's PKIX DER: the
// form `tetherctl node update --ek` takes.
func EKHash(pub crypto.PublicKey) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("EK public key: %w", err)
	}
	sum := sha256.Sum256(der)
	return ekHashPrefix + hex.EncodeToString(sum[:]), nil
}

// EKHashDER hashes an EK given as PKIX DER, after checking that it is a
// public key of a kind a TPM's EK has.
func EKHashDER(der []byte) (string, error) {
	if _, err := parseEK(der); err != nil {
		return "", err
	}
	sum := sha256.Sum256(der)
	return ekHashPrefix + hex.EncodeToString(sum[:]), nil
}

// ParseEKHash checks the operator's form, sha256: and 64 hex digits, and
// returns it in lower case.
func ParseEKHash(s string) (string, error) {
	shown := s
	if len(shown) > len(ekHashPrefix)+64 {
		shown = shown[:len(ekHashPrefix)+64] + "..."
	}
	h, ok := strings.CutPrefix(s, ekHashPrefix)
	if !ok {
		return "", fmt.Errorf("%q is not sha256:HEX (the SHA-256 of the EK public key)", shown)
	}
	if len(h) != 64 {
		return "", fmt.Errorf("%q has %d hex digits, want 64", shown, len(h))
	}
	if _, err := hex.DecodeString(h); err != nil {
		return "", fmt.Errorf("%q is not hex", shown)
	}
	return ekHashPrefix + strings.ToLower(h), nil
}

func parseEK(der []byte) (crypto.PublicKey, error) {
	if len(der) > MaxEKBytes {
		return nil, fmt.Errorf("%w: EK of %d bytes (at most %d)", ErrTooLarge, len(der), MaxEKBytes)
	}
	pub, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, fmt.Errorf("%w: EK is not a PKIX public key: %v", ErrMalformed, err)
	}
	switch pub.(type) {
	case *rsa.PublicKey, *ecdsa.PublicKey:
	default:
		return nil, fmt.Errorf("%w: EK is a %T; a TPM's EK is RSA or ECC", ErrMalformed, pub)
	}
	return pub, nil
}

// CheckEKCertificate parses an EK public key (PKIX DER) and its
// certificate (DER) and checks that the certificate carries that key; it
// returns the certificate. Nothing checks who issued it: Tether holds no
// list of TPM makers' roots, so an EK certificate proves only that the
// machine sent one that matches.
func CheckEKCertificate(ekDER, certDER []byte) (*x509.Certificate, error) {
	ek, err := parseEK(ekDER)
	if err != nil {
		return nil, err
	}
	return checkEKCertificate(ek, certDER)
}

func checkEKCertificate(ek crypto.PublicKey, certDER []byte) (*x509.Certificate, error) {
	if len(certDER) > MaxEKBytes {
		return nil, fmt.Errorf("%w: EK certificate of %d bytes (at most %d)", ErrTooLarge, len(certDER), MaxEKBytes)
	}
	cert, err := gattest.ParseEKCertificate(certDER)
	if err != nil {
		return nil, fmt.Errorf("%w: EK certificate: %v", ErrMalformed, err)
	}
	if k, ok := cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !k.Equal(ek) {
		return nil, fmt.Errorf("%w: the certificate (serial %s) is for another key", ErrEKCertMismatch, cert.SerialNumber)
	}
	return cert, nil
}

// NewChallenge checks an AK and makes the credential that only the TPM
// holding ekDER can activate, and only for that AK. secret is what the
// machine must give back. ekCertDER is optional; when given it must carry
// the same public key.
func NewChallenge(ekDER, ekCertDER []byte, ak AKParams, rnd io.Reader) (Challenge, []byte, error) {
	ek, err := parseEK(ekDER)
	if err != nil {
		return Challenge{}, nil, err
	}
	if len(ekCertDER) > 0 {
		if _, err := checkEKCertificate(ek, ekCertDER); err != nil {
			return Challenge{}, nil, err
		}
	}
	if err := checkAKSizes(ak); err != nil {
		return Challenge{}, nil, err
	}
	// Generate checks the AK (CheckAKParameters) before it makes the
	// credential; calling both verified its creation signature twice.
	p := gattest.ActivationParameters{EK: ek, AK: akParams(ak), Rand: rnd}
	secret, ec, err := p.Generate()
	if err != nil {
		return Challenge{}, nil, fmt.Errorf("%w: %v", ErrBadAK, err)
	}
	return Challenge{Credential: ec.Credential, Secret: ec.Secret}, secret, nil
}

func checkAKSizes(ak AKParams) error {
	for _, f := range []struct {
		name string
		b    []byte
	}{{"public area", ak.Public}, {"creation data", ak.CreateData}, {"creation attestation", ak.CreateAttestation}, {"creation signature", ak.CreateSignature}} {
		if len(f.b) == 0 {
			return fmt.Errorf("%w: the AK's %s is missing", ErrMalformed, f.name)
		}
		if len(f.b) > MaxAKBytes {
			return fmt.Errorf("%w: the AK's %s is %d bytes (at most %d)", ErrTooLarge, f.name, len(f.b), MaxAKBytes)
		}
	}
	return nil
}

func akParams(ak AKParams) gattest.AttestationParameters {
	return gattest.AttestationParameters{Public: ak.Public, CreateData: ak.CreateData,
		CreateAttestation: ak.CreateAttestation, CreateSignature: ak.CreateSignature}
}

// nonceDomain keeps a quote made for enrollment from being valid for any
// other use of the same inputs.
const nonceDomain = "tether attested enrollment v1\x00"

// Nonce binds a quote to one enrollment, its activation secret and its
// CSR: a quote replayed from another enrollment, or carried to another
// CSR, has another nonce. 32 bytes, within what every TPM takes.
func Nonce(enrollmentID string, secret, csrDER []byte) []byte {
	h := sha256.New()
	h.Write([]byte(nonceDomain))
	for _, b := range [][]byte{[]byte(enrollmentID), secret, csrDER} {
		var n [4]byte
		n[0], n[1], n[2], n[3] = byte(len(b)>>24), byte(len(b)>>16), byte(len(b)>>8), byte(len(b))
		h.Write(n[:])
		h.Write(b)
	}
	return h.Sum(nil)
}

// VerifyEvidence checks that the quotes are signed by the AK, cover
// ev.PCRs and carry nonce, and that the event log replays to the quoted
// PCRs.
func VerifyEvidence(ak AKParams, ev Evidence, nonce []byte) (Result, error) {
	if err := checkEvidenceSizes(ev); err != nil {
		return Result{}, err
	}
	if len(ak.Public) == 0 || len(ak.Public) > MaxAKBytes {
		return Result{}, fmt.Errorf("%w: the AK's public area is %d bytes", ErrMalformed, len(ak.Public))
	}
	pub, err := gattest.ParseAKPublic(ak.Public)
	if err != nil {
		return Result{}, fmt.Errorf("%w: AK: %v", ErrMalformed, err)
	}
	pcrs := make([]gattest.PCR, 0, len(ev.PCRs))
	seen := map[int]bool{}
	for _, p := range ev.PCRs {
		if p.Index < 0 || p.Index >= MaxPCRs {
			return Result{}, fmt.Errorf("%w: PCR index %d", ErrMalformed, p.Index)
		}
		if seen[p.Index] {
			return Result{}, fmt.Errorf("%w: PCR %d given twice", ErrMalformed, p.Index)
		}
		seen[p.Index] = true
		if len(p.Digest) != sha256.Size {
			return Result{}, fmt.Errorf("%w: PCR %d has %d bytes, a SHA-256 PCR has %d", ErrMalformed, p.Index, len(p.Digest), sha256.Size)
		}
		pcrs = append(pcrs, gattest.PCR{Index: p.Index, Digest: p.Digest, DigestAlg: crypto.SHA256})
	}
	quotes := make([]gattest.Quote, 0, len(ev.Quotes))
	for _, q := range ev.Quotes {
		quotes = append(quotes, gattest.Quote{Quote: q.Quote, Signature: q.Signature})
	}
	// The nonce is checked first and on its own: a quote that verifies
	// but carries another nonce is a replay, and says so.
	for i, q := range quotes {
		got, err := quoteNonce(q.Quote)
		if err != nil {
			return Result{}, fmt.Errorf("%w: quote %d: %v", ErrMalformed, i, err)
		}
		if string(got) != string(nonce) {
			return Result{}, fmt.Errorf("%w: quote %d carries another nonce (an earlier enrollment's, or another CSR's)", ErrNonce, i)
		}
	}
	if err := pub.VerifyAll(quotes, pcrs, nonce); err != nil {
		return Result{}, fmt.Errorf("%w: %v", ErrBadQuote, err)
	}
	if len(ev.EventLog) == 0 {
		return Result{}, nil
	}
	n, err := replay(ev.EventLog, pcrs)
	if err != nil {
		return Result{}, err
	}
	return Result{Events: n, EventLog: true}, nil
}

// ReplayEventLog replays a TCG event log against PCR values (unquoted:
// VerifyEvidence quotes them first) and returns how many events it holds.
func ReplayEventLog(log []byte, pcrs []PCR) (int, error) {
	if len(log) > MaxEventLogBytes {
		return 0, fmt.Errorf("%w: event log of %d bytes (at most %d)", ErrTooLarge, len(log), MaxEventLogBytes)
	}
	gp := make([]gattest.PCR, 0, len(pcrs))
	for _, p := range pcrs {
		gp = append(gp, gattest.PCR{Index: p.Index, Digest: p.Digest, DigestAlg: crypto.SHA256})
	}
	return replay(log, gp)
}

func replay(log []byte, pcrs []gattest.PCR) (int, error) {
	el, err := gattest.ParseEventLog(log)
	if err != nil {
		return 0, fmt.Errorf("%w: event log: %v", ErrMalformed, err)
	}
	events, err := el.Verify(pcrs)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrEventLog, err)
	}
	return len(events), nil
}

// quoteNonce is the qualifying data of a TPMS_ATTEST of type quote.
func quoteNonce(b []byte) ([]byte, error) {
	att, err := tpm2.DecodeAttestationData(b)
	if err != nil {
		return nil, err
	}
	if att.Type != tpm2.TagAttestQuote {
		return nil, fmt.Errorf("attestation of type %#x, not a quote", att.Type)
	}
	return att.ExtraData, nil
}

func checkEvidenceSizes(ev Evidence) error {
	if len(ev.Quotes) == 0 {
		return fmt.Errorf("%w: no quote", ErrMalformed)
	}
	if len(ev.Quotes) > MaxQuotes {
		return fmt.Errorf("%w: %d quotes (at most %d)", ErrTooLarge, len(ev.Quotes), MaxQuotes)
	}
	for i, q := range ev.Quotes {
		if len(q.Quote)+len(q.Signature) > MaxQuoteBytes {
			return fmt.Errorf("%w: quote %d is %d bytes (at most %d)", ErrTooLarge, i, len(q.Quote)+len(q.Signature), MaxQuoteBytes)
		}
	}
	if len(ev.PCRs) == 0 {
		return fmt.Errorf("%w: no PCR values", ErrMalformed)
	}
	if len(ev.PCRs) > MaxPCRs {
		return fmt.Errorf("%w: %d PCR values (a bank has %d)", ErrTooLarge, len(ev.PCRs), MaxPCRs)
	}
	if len(ev.EventLog) > MaxEventLogBytes {
		return fmt.Errorf("%w: event log of %d bytes (at most %d)", ErrTooLarge, len(ev.EventLog), MaxEventLogBytes)
	}
	return nil
}
