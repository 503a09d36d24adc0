// Package tpm is the machine's TPM 2.0 as an attested enrollment needs it
// (docs/adr/0023): the endorsement key, a fresh attestation key for each
// enrollment, credential activation and a quote over the SHA-256 PCRs,
// with the firmware's event log. go-attestation speaks to the TPM.
package tpm

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"

	gattest "github.com/google/go-attestation/attest"

	"github.com/tetherfleet/tether/pki/attestation"
)

// Where the kernel exposes the TPM and its firmware's event log.
const (
	DevicePath   = "/dev/tpmrm0"
	EventLogPath = "/sys/kernel/security/tpm0/binary_bios_measurements"
)

// ErrNoTPM is Open's error on a machine without a TPM 2.0.
var ErrNoTPM = errors.New("no TPM")

// TPM is an open TPM 2.0.
type TPM struct {
	t        *gattest.TPM
	eventLog []byte
}

// Open opens the TPM at path (the kernel's resource manager, DevicePath)
// and reads the firmware's event log where the kernel exposes one.
func Open(path string) (*TPM, error) {
	// Opened blocking, by hand: os.OpenFile puts a character device in
	// non-blocking mode for Go's poller, and the kernel's TPM device then
	// runs commands asynchronously and answers a read made before the
	// response is ready with 0 bytes, which reads as EOF.
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil, fmt.Errorf("%w: %s does not exist", ErrNoTPM, path)
	}
	if err != nil {
		return nil, fmt.Errorf("open TPM %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	log, err := os.ReadFile(EventLogPath)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		f.Close()
		return nil, fmt.Errorf("read the TPM event log: %w", err)
	}
	return OpenChannel(f, log)
}

// OpenChannel uses rwc as the TPM's command channel (a device, or a
// software TPM's socket in tests), with eventLog as the firmware's log.
func OpenChannel(rwc io.ReadWriteCloser, eventLog []byte) (*TPM, error) {
	t, err := gattest.OpenTPM(&gattest.OpenConfig{CommandChannel: channel{rwc}})
	if err != nil {
		rwc.Close()
		return nil, fmt.Errorf("open TPM: %w", err)
	}
	return &TPM{t: t, eventLog: eventLog}, nil
}

// channel is a bare command channel: the event log is read by Open, not
// through the channel.
type channel struct{ io.ReadWriteCloser }

func (channel) MeasurementLog() ([]byte, error) {
	return nil, errors.New("no event log through the channel")
}

// Close closes the command channel.
func (t *TPM) Close() error { return t.t.Close() }

// EK is the TPM's endorsement key.
type EK struct {
	PublicDER      []byte // PKIX
	CertificateDER []byte // nil when the TPM's NV holds none
}

// EK reads the endorsement key: the RSA EK with its certificate from NV
// where the manufacturer (or swtpm_setup) wrote one, else the key made
// from the standard template.
func (t *TPM) EK() (EK, error) {
	eks, err := t.t.EKs()
	if err != nil {
		return EK{}, fmt.Errorf("read the endorsement key: %w", err)
	}
	if len(eks) == 0 {
		return EK{}, errors.New("the TPM reports no endorsement key")
	}
	der, err := x509.MarshalPKIXPublicKey(eks[0].Public)
	if err != nil {
		return EK{}, fmt.Errorf("endorsement key: %w", err)
	}
	ek := EK{PublicDER: der}
	if c := eks[0].Certificate; c != nil {
		ek.CertificateDER = c.Raw
	}
	return ek, nil
}

// EventLog is the firmware's TCG event log; nil when there is none.
func (t *TPM) EventLog() []byte { return t.eventLog }

// AK is an attestation key made for one enrollment.
type AK struct {
	t  *TPM
	ak *gattest.AK
}

// NewAK creates a fresh attestation key: a restricted signing key under
// the storage root key, which never leaves the TPM. It is ECDSA P-256: a
// TPM makes an RSA key by searching for primes, which takes it far longer
// (docs/benchmarks.md, BenchmarkNewAK), and every boot makes one.
func (t *TPM) NewAK() (*AK, error) { return t.newAK(gattest.ECDSA) }

func (t *TPM) newAK(alg gattest.Algorithm) (*AK, error) {
	ak, err := t.t.NewAK(&gattest.AKConfig{Algorithm: alg})
	if err != nil {
		return nil, fmt.Errorf("create an attestation key: %w", err)
	}
	return &AK{t: t, ak: ak}, nil
}

// Params describes the key for the control plane.
func (a *AK) Params() attestation.AKParams {
	p := a.ak.AttestationParameters()
	return attestation.AKParams{Public: p.Public, CreateData: p.CreateData, CreateAttestation: p.CreateAttestation, CreateSignature: p.CreateSignature}
}

// Activate releases the challenge's secret. The TPM does so only if the
// credential was made for this key and encrypted to its EK.
func (a *AK) Activate(c attestation.Challenge) ([]byte, error) {
	secret, err := a.ak.ActivateCredential(a.t.t, gattest.EncryptedCredential{Credential: c.Credential, Secret: c.Secret})
	if err != nil {
		return nil, fmt.Errorf("activate credential: %w", err)
	}
	return secret, nil
}

// Quote signs the SHA-256 PCRs with nonce, and returns them with the
// event log.
func (a *AK) Quote(nonce []byte) (attestation.Evidence, error) {
	// PCRs first, as go-attestation does: a PCR extended between the two
	// makes the quote disagree with the values, which the control plane
	// refuses, rather than a quote of values never sent.
	pcrs, err := a.t.t.PCRs(gattest.HashSHA256)
	if err != nil {
		return attestation.Evidence{}, fmt.Errorf("read the SHA-256 PCRs: %w", err)
	}
	q, err := a.ak.Quote(a.t.t, nonce, gattest.HashSHA256)
	if err != nil {
		return attestation.Evidence{}, fmt.Errorf("quote: %w", err)
	}
	ev := attestation.Evidence{Quotes: []attestation.Quote{{Quote: q.Quote, Signature: q.Signature}}, EventLog: a.t.eventLog}
	for _, p := range pcrs {
		ev.PCRs = append(ev.PCRs, attestation.PCR{Index: p.Index, Digest: p.Digest})
	}
	return ev, nil
}

// Close flushes the key from the TPM.
func (a *AK) Close() error { return a.ak.Close(a.t.t) }
