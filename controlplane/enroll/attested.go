package enroll

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/pki/attestation"
	"github.com/tetherfleet/tether/pki/ca"
)

// Begin is the opening of an attested enrollment (docs/adr/0023): the
// instance the machine claims to boot as, its CSR, and its TPM's EK and
// fresh attestation key.
type Begin struct {
	InstanceID    store.InstanceID
	CSRPEM        string
	EKPublic      []byte // PKIX DER
	EKCertificate []byte // DER; nil when the TPM holds none
	AK            attestation.AKParams
}

// Attestation is one attested enrollment between its challenge and its
// proof. It lives only in the stream that began it: the secret never
// reaches the store, so no replica, backup or replay can answer it.
type Attestation struct {
	// ID names the enrollment; the quote's nonce binds it.
	ID         string
	InstanceID store.InstanceID
	NodeID     store.NodeID
	EKHash     string

	ak     attestation.AKParams
	csr    *x509.CertificateRequest
	secret []byte
	nonce  []byte
}

// BeginAttested checks that the EK presented is the one bound to the
// claimed instance's node and that the AK is a TPM's restricted signing
// key, then makes the challenge: a credential only that TPM can activate,
// and only for that AK. Nothing is written but refusal events.
func (s *Service) BeginAttested(ctx context.Context, b Begin) (*Attestation, attestation.Challenge, error) {
	var none attestation.Challenge
	if b.InstanceID == "" {
		return nil, none, fail.Invalid("begin.instance_id", "required")
	}
	if len(b.InstanceID) > 128 {
		return nil, none, fail.Invalid("begin.instance_id", "%d bytes is longer than an instance id", len(b.InstanceID))
	}
	if b.CSRPEM == "" {
		return nil, none, fail.Invalid("begin.csr_pem", "required")
	}
	if len(b.CSRPEM) > MaxCSRBytes {
		return nil, none, fail.Invalid("begin.csr_pem", "%d bytes is more than the %d a CSR needs", len(b.CSRPEM), MaxCSRBytes)
	}
	if len(b.EKPublic) == 0 {
		return nil, none, fail.Invalid("begin.ek_public", "required")
	}
	csr, err := ca.ParseCSR([]byte(b.CSRPEM))
	if err != nil {
		return nil, none, fail.Invalid("begin.csr_pem", "%v", err)
	}
	ekHash, err := attestation.EKHashDER(b.EKPublic)
	if err != nil {
		return nil, none, fail.Invalid("begin.ek_public", "%v", err)
	}
	now := s.Clock.Now()

	// Two one-row reads in the common case; the node is read only to
	// explain a refusal.
	instNode, status, err := s.Store.InstanceNode(ctx, b.InstanceID)
	if errors.Is(err, store.ErrNotFound) {
		s.refusedAttest(ctx, "", ekHash, now, "no such instance "+b.InstanceID.String())
		return nil, none, fail.Denied("attested enrollment refused: no instance %s", b.InstanceID)
	}
	if err != nil {
		return nil, none, err
	}
	inst := &store.Instance{ID: b.InstanceID, NodeID: instNode, Status: status}
	if inst.Status == lifecycle.Terminated {
		s.refusedAttest(ctx, inst.ID, ekHash, now, "instance is terminated")
		return nil, none, fail.Precondition("attested enrollment refused: instance %s is terminated", inst.ID)
	}
	bound, err := s.Store.EKNodeID(ctx, ekHash)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, none, fmt.Errorf("look up EK %s: %w", ekHash, err)
	}
	if bound != inst.NodeID {
		node, err := s.Store.GetNodeByID(ctx, inst.NodeID)
		if err != nil {
			return nil, none, fmt.Errorf("read node of instance %s: %w", inst.ID, err)
		}
		return nil, none, s.ekMismatch(ctx, inst, node, ekHash, now)
	}

	c, secret, err := attestation.NewChallenge(b.EKPublic, b.EKCertificate, b.AK, rand.Reader)
	if err != nil {
		s.refusedAttest(ctx, inst.ID, ekHash, now, reason(err))
		return nil, none, fail.Invalid(field(err), "%v", err)
	}
	id, err := enrollmentID(rand.Reader)
	if err != nil {
		return nil, none, err
	}
	return &Attestation{ID: id, InstanceID: inst.ID, NodeID: inst.NodeID, EKHash: ekHash,
		ak: b.AK, csr: csr, secret: secret, nonce: attestation.Nonce(id, secret, csr.Raw)}, c, nil
}

// Nonce is what the agent's quote must carry; exported for tests and for
// the agent's side, which computes it from the same inputs.
func (a *Attestation) Nonce() []byte { return a.nonce }

// FinishAttested checks the proof: the activated secret (the AK lives in
// the TPM that holds the EK), the quote's signature and nonce (made now,
// for this enrollment and this CSR), and the event log's replay against
// the quoted PCRs. Only then does it sign, in the transaction that records
// the enrollment, as a token enrollment does.
func (s *Service) FinishAttested(ctx context.Context, a *Attestation, secret []byte, ev attestation.Evidence) (*Issued, error) {
	now := s.Clock.Now()
	if subtle.ConstantTimeCompare(secret, a.secret) != 1 {
		s.refusedAttest(ctx, a.InstanceID, a.EKHash, now, "the credential was not activated by the TPM holding the EK")
		return nil, fail.Denied("attested enrollment refused: the activated secret is wrong; the attestation key is not in the TPM of EK %s", a.EKHash)
	}
	res, err := attestation.VerifyEvidence(a.ak, ev, a.nonce)
	if err != nil {
		s.refusedAttest(ctx, a.InstanceID, a.EKHash, now, reason(err))
		if errors.Is(err, attestation.ErrTooLarge) || errors.Is(err, attestation.ErrMalformed) {
			return nil, fail.Invalid("proof", "%v", err)
		}
		return nil, fail.Denied("attested enrollment refused: %v", err)
	}
	if err := s.checkMeasured(ctx, a, ev, now); err != nil {
		return nil, err
	}
	cert, err := s.CA.SignNode(ctx, a.csr, a.InstanceID.String(), s.Lifetime)
	if err != nil {
		return nil, fail.Invalid("begin.csr_pem", "%v", err)
	}
	err = s.Store.Tx(ctx, func(q store.Queries) error {
		status, err := q.InstanceStatus(ctx, a.InstanceID)
		if errors.Is(err, store.ErrNotFound) || (err == nil && status == lifecycle.Terminated) {
			return errTerminated
		}
		if err != nil {
			return err
		}
		// The binding is read again where the enrollment commits: an
		// operator who unbinds an EK while a challenge is out has the
		// last word.
		bound, err := q.EKNodeID(ctx, a.EKHash)
		if errors.Is(err, store.ErrNotFound) || (err == nil && bound != a.NodeID) {
			return errUnbound
		}
		if err != nil {
			return err
		}
		if err := q.CreateCertificate(ctx, s.record(cert, a.InstanceID, now)); err != nil {
			return err
		}
		_, err = events.E{Kind: events.EnrollSucceeded, InstanceID: a.InstanceID,
			Message: "enrolled by TPM attestation (EK " + a.EKHash + "); certificate " + ca.SerialString(cert),
			Payload: events.AttestedPayload{Attested: true, EK: a.EKHash, EventLog: res.EventLog, Events: res.Events,
				NotAfter: cert.NotAfter.UTC().Format(time.RFC3339), Serial: store.CertSerial(ca.SerialString(cert))}}.Write(ctx, q, now)
		return err
	})
	switch {
	case errors.Is(err, errTerminated):
		s.refusedAttest(ctx, a.InstanceID, a.EKHash, now, "instance is terminated or gone")
		return nil, fail.Precondition("attested enrollment refused: instance %s is terminated", a.InstanceID)
	case errors.Is(err, errUnbound):
		s.refusedAttest(ctx, a.InstanceID, a.EKHash, now, "the EK was unbound from the node during the enrollment")
		return nil, fail.Precondition("attested enrollment refused: EK %s is no longer bound to the node of instance %s", a.EKHash, a.InstanceID)
	case err != nil:
		return nil, err
	}
	return &Issued{InstanceID: a.InstanceID, Cert: cert}, nil
}

var errUnbound = errors.New("EK unbound")

// ekMismatch refuses an EK that is not the node's. Another node's EK, or
// a node whose TPM is not the one registered, is a machine that moved or
// a TPM that was swapped or forged: high severity, naming every hash, and
// refused until an operator binds it. A node with no EK yet is a plain
// precondition: say how to bind it.
func (s *Service) ekMismatch(ctx context.Context, inst *store.Instance, node *store.Node, ekHash string, now time.Time) error {
	other, err := s.Store.NodeByEK(ctx, ekHash)
	switch {
	case err == nil && other.ID != node.ID:
		msg := fmt.Sprintf("instance %s of node %s presented EK %s, which is bound to node %s", inst.ID, node.Name, ekHash, other.Name)
		s.note(ctx, "ekmoved/"+inst.ID.String()+"/"+ekHash, now, refusal{kind: events.EnrollEKMismatch, severity: events.High, instanceID: inst.ID,
			message: "attested enrollment refused: " + msg},
			events.EKMovedPayload{BoundTo: other.Name, Count: 1, EK: ekHash, Node: node.Name, Registered: node.EKHashes})
		return fail.Denied("attested enrollment refused: %s; an operator must move the binding (tetherctl node update)", msg)
	case err != nil && !errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("look up EK %s: %w", ekHash, err)
	case len(node.EKHashes) > 0:
		msg := fmt.Sprintf("node %s presented EK %s, but its registered EK is %s", node.Name, ekHash, strings.Join(node.EKHashes, ", "))
		s.note(ctx, "ekchanged/"+inst.ID.String()+"/"+ekHash, now, refusal{kind: events.EnrollEKMismatch, severity: events.High, instanceID: inst.ID,
			message: "attested enrollment refused: " + msg},
			events.EKChangedPayload{Count: 1, EK: ekHash, Node: node.Name, Registered: node.EKHashes})
		return fail.Denied("attested enrollment refused: %s; if the TPM was replaced, bind the new one: tetherctl node update %s --ek %s", msg, node.Name, ekHash)
	default:
		s.refusedAttest(ctx, inst.ID, ekHash, now, "node "+node.Name+" has no EK bound")
		return fail.Precondition("attested enrollment refused: node %s has no EK bound; bind this machine's TPM with: tetherctl node update %s --ek %s",
			node.Name, node.Name, ekHash)
	}
}

// refusedAttest is the coalesced event of an attestation refused for a
// reason that names no other machine.
func (s *Service) refusedAttest(ctx context.Context, instanceID store.InstanceID, ekHash string, now time.Time, why string) {
	s.note(ctx, "attest/"+instanceID.String()+"/"+ekHash+"/"+why, now, refusal{kind: events.EnrollRefused, severity: events.Medium, instanceID: instanceID,
		message: "attested enrollment refused: " + why}, events.AttestRefusedPayload{Attested: true, Count: 1, EK: ekHash})
}

// reason is the short cause of a verification error, for the event key:
// one event per cause, not per detail.
func reason(err error) string {
	for _, e := range []error{attestation.ErrTooLarge, attestation.ErrMalformed, attestation.ErrBadAK, attestation.ErrEKCertMismatch,
		attestation.ErrBadActivation, attestation.ErrBadQuote, attestation.ErrNonce, attestation.ErrEventLog} {
		if errors.Is(err, e) {
			return e.Error()
		}
	}
	return err.Error()
}

// field names the part of the opening an error is about.
func field(err error) string {
	switch {
	case errors.Is(err, attestation.ErrEKCertMismatch):
		return "begin.ek_certificate"
	case errors.Is(err, attestation.ErrBadAK):
		return "begin.ak"
	}
	return "begin"
}

func enrollmentID(r io.Reader) (string, error) {
	var b [16]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return "", fmt.Errorf("enrollment id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}
