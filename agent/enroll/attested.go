package enroll

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"

	"github.com/tetherfleet/tether/pki/attestation"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// Attester is the machine's TPM as enrollment needs it (agent/tpm).
type Attester interface {
	// Endorsement returns the EK's public key (PKIX DER) and its
	// certificate (DER; nil when the TPM holds none).
	Endorsement() (pub, cert []byte, err error)
	// NewKey creates a fresh attestation key in the TPM.
	NewKey() (AttestationKey, error)
}

// AttestationKey is one enrollment's key in the TPM.
type AttestationKey interface {
	Params() attestation.AKParams
	Activate(attestation.Challenge) ([]byte, error)
	Quote(nonce []byte) (attestation.Evidence, error)
	Close() error
}

// EnrollAttested proves this machine by its TPM and gets a certificate for
// instanceID, with no token (docs/adr/0023): the EK and a fresh AK go out,
// the control plane's credential comes back, the TPM activates it, and a
// quote whose nonce binds this enrollment and the CSR goes out with the
// event log. client must be on a connection from Dial(false).
func (m *Manager) EnrollAttested(ctx context.Context, client tetherv1.EnrollmentServiceClient, instanceID string, tpm Attester) (*Identity, error) {
	m.renewMu.Lock()
	defer m.renewMu.Unlock()
	key, csr, err := newKeyAndCSR()
	if err != nil {
		return nil, fmt.Errorf("attested enroll: %w", err)
	}
	block, _ := pem.Decode([]byte(csr))
	if block == nil {
		return nil, errors.New("attested enroll: the CSR just made is not PEM")
	}
	ekPub, ekCert, err := tpm.Endorsement()
	if err != nil {
		return nil, fmt.Errorf("attested enroll: read the TPM's endorsement key: %w", err)
	}
	ak, err := tpm.NewKey()
	if err != nil {
		return nil, fmt.Errorf("attested enroll: create an attestation key: %w", err)
	}
	defer ak.Close()
	p := ak.Params()

	m.pin.TakeMismatch()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.EnrollAttested(ctx)
	if err != nil {
		return nil, m.rpcError("attested enroll", err)
	}
	if err := stream.Send(&tetherv1.AttestedEnrollRequest{Step: &tetherv1.AttestedEnrollRequest_Begin{Begin: &tetherv1.AttestBegin{
		InstanceId: instanceID, CsrPem: csr, EkPublic: ekPub, EkCertificate: ekCert,
		Ak: &tetherv1.AttestationKey{Public: p.Public, CreateData: p.CreateData, CreateAttestation: p.CreateAttestation, CreateSignature: p.CreateSignature},
	}}}); err != nil {
		return nil, m.rpcError("attested enroll", recvErr(stream, err))
	}
	resp, err := stream.Recv()
	if err != nil {
		return nil, m.rpcError("attested enroll", err)
	}
	ch := resp.GetChallenge()
	if ch == nil {
		return nil, errors.New("attested enroll: the control plane answered begin with something other than a challenge")
	}
	secret, err := ak.Activate(attestation.Challenge{Credential: ch.GetCredential(), Secret: ch.GetSecret()})
	if err != nil {
		return nil, fmt.Errorf("attested enroll: the TPM would not activate the control plane's credential: %w", err)
	}
	ev, err := ak.Quote(attestation.Nonce(ch.GetEnrollmentId(), secret, block.Bytes))
	if err != nil {
		return nil, fmt.Errorf("attested enroll: quote: %w", err)
	}
	proof := &tetherv1.AttestProof{Secret: secret, EventLog: ev.EventLog}
	for _, q := range ev.Quotes {
		proof.Quotes = append(proof.Quotes, &tetherv1.TPMQuote{Quote: q.Quote, Signature: q.Signature})
	}
	for _, r := range ev.PCRs {
		proof.Pcrs = append(proof.Pcrs, &tetherv1.PCRValue{Index: uint32(r.Index), Digest: r.Digest})
	}
	if err := stream.Send(&tetherv1.AttestedEnrollRequest{Step: &tetherv1.AttestedEnrollRequest_Proof{Proof: proof}}); err != nil {
		return nil, m.rpcError("attested enroll", recvErr(stream, err))
	}
	resp, err = stream.Recv()
	if err != nil {
		return nil, m.rpcError("attested enroll", err)
	}
	_ = stream.CloseSend()
	done := resp.GetEnrolled()
	if done == nil {
		return nil, errors.New("attested enroll: the control plane answered the proof with something other than a certificate")
	}
	id, err := m.accept(key, done.GetCertificatePem(), done.GetCaPem(), instanceID)
	if err != nil {
		return nil, fmt.Errorf("attested enroll: %w", err)
	}
	if err := m.commit(id, m.savedMeta("enroll")); err != nil {
		return nil, fmt.Errorf("attested enroll: %w", err)
	}
	return id, nil
}

// recvErr turns a failed Send into the server's status: gRPC reports a
// stream the server ended as io.EOF on Send, and the reason on Recv.
func recvErr(stream tetherv1.EnrollmentService_EnrollAttestedClient, sendErr error) error {
	if _, err := stream.Recv(); err != nil {
		return err
	}
	return sendErr
}
