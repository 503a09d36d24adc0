// Package enroll turns one-time bootstrap tokens and CSRs into node
// certificates (docs/design.md §3), and renews them over mTLS.
package enroll

import (
	"context"
	"crypto"
	"crypto/subtle"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/throttle"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/pki"
	"github.com/tetherfleet/tether/pki/ca"
)

// MaxCSRBytes bounds what Enroll will parse.
const MaxCSRBytes = 8 << 10

// Service issues node certificates.
type Service struct {
	Store    store.Store
	CA       *ca.CA
	Clock    clock.Clock
	Log      *slog.Logger
	Lifetime time.Duration // zero: ca.DefaultNodeLifetime
	// Refusals coalesces repeated refusals into one event per window
	// (nil: one window of RefusalWindow). Nobody needs a credential to be
	// refused, so one event per try would let anyone fill the event log.
	Refusals *throttle.Coalescer
	// MeasuredBoot, when set, checks at an attested enrollment that the
	// node booted what its template requires (measured.go).
	MeasuredBoot MeasuredBoot

	once sync.Once
}

// RefusalWindow is the default coalescing window of refusal events.
const RefusalWindow = time.Minute

func (s *Service) refusals() *throttle.Coalescer {
	s.once.Do(func() {
		if s.Refusals == nil {
			s.Refusals = throttle.NewCoalescer(RefusalWindow, 0)
		}
	})
	return s.Refusals
}

// Issued is a signed certificate and whom it names.
type Issued struct {
	InstanceID store.InstanceID
	Cert       *x509.Certificate
}

// attestationRequired rolls back a token enrollment for an instance whose
// node or template requires TPM attestation.
type attestationRequired struct{ why string }

func (e *attestationRequired) Error() string { return "attestation required: " + e.why }

// errTerminated rolls back an enrollment whose instance was terminated.
var errTerminated = errors.New("instance is terminated")

// errRefused is the one answer for an unknown, expired, spent or
// terminated token: which of them it was is for the audit log, not for
// whoever is holding the token.
var errRefused = fail.Unauthenticated("bootstrap token refused: it is unknown, expired or already used; ask the operator for a fresh one (tetherctl token create --instance ID)")

// Enroll checks the token, signs the CSR and, in one transaction, spends the
// token and records the certificate.
func (s *Service) Enroll(ctx context.Context, token, csrPEM string) (*Issued, error) {
	if token == "" {
		return nil, fail.Invalid("token", "required")
	}
	if csrPEM == "" {
		return nil, fail.Invalid("csr_pem", "required")
	}
	if len(csrPEM) > MaxCSRBytes {
		return nil, fail.Invalid("csr_pem", "%d bytes is more than the %d a CSR needs", len(csrPEM), MaxCSRBytes)
	}
	csr, err := ca.ParseCSR([]byte(csrPEM))
	if err != nil {
		return nil, fail.Invalid("csr_pem", "%v", err)
	}
	hash, err := pki.ParseToken(token)
	if err != nil {
		return nil, errRefused
	}
	key := pki.Fingerprint(csr.RawSubjectPublicKeyInfo)
	now := s.Clock.Now()

	// A read first, so that a bad token or a bad CSR costs no signature and
	// changes nothing. The transaction below re-checks authoritatively.
	tok, err := s.Store.GetToken(ctx, hash)
	if errors.Is(err, store.ErrNotFound) {
		s.Log.Warn("enrollment refused: unknown token")
		return nil, errRefused
	}
	if err != nil {
		return nil, err
	}
	if tok.UsedAt != nil {
		if sameEnrollment(tok, key, now) {
			return s.reissue(ctx, tok, csr, now)
		}
		s.reused(ctx, tok, now)
		return nil, errRefused
	}
	if !tok.ExpiresAt.After(now) {
		s.refused(ctx, tok.InstanceID, now, "token expired at "+tok.ExpiresAt.Format(time.RFC3339))
		return nil, errRefused
	}
	// SignNode checks the policy and the CSR's signature before anything is
	// spent; a refusal here leaves the token usable.
	cert, err := s.CA.SignNode(ctx, csr, tok.InstanceID.String(), s.Lifetime)
	if err != nil {
		return nil, fail.Invalid("csr_pem", "%v", err)
	}
	// The instance is checked in the transaction that spends the token, not
	// in a second read before signing: terminating an instance expires its
	// tokens, so the read above refuses those already, and the extra read
	// was a seventh of the store's CPU per enrollment (docs/benchmarks.md).
	// Only a token racing its instance's termination costs a signature;
	// it is still refused, and the token is left as it was.
	spent := tok
	err = s.Store.Tx(ctx, func(q store.Queries) error {
		if t, err := q.ConsumeToken(ctx, hash, key, now); err != nil {
			if t != nil {
				spent = t
			}
			return err
		}
		return s.issueTx(ctx, q, tok.InstanceID, cert, now, events.EnrollSucceeded, "enrolled; certificate "+ca.SerialString(cert))
	})
	if errors.Is(err, store.ErrTokenUsed) && spent.UsedAt != nil {
		// Another enrollment spent the token between the read and this
		// transaction: this one's own first try, if it is for the same key
		// (an agent that retried while its first attempt was still being
		// answered), else somebody else holding the token.
		if sameEnrollment(spent, key, now) {
			return s.reissue(ctx, spent, csr, now)
		}
		s.reused(ctx, spent, now)
		return nil, errRefused
	}
	if err := s.refusal(ctx, tok.InstanceID, now, err); err != nil {
		return nil, err
	}
	return &Issued{InstanceID: tok.InstanceID, Cert: cert}, nil
}

// sameEnrollment says whether an enrollment presenting a spent token for
// key is the one that spent it, retried because its answer was lost (a
// connection cut after the commit, a replica that died before replying):
// the same token, for the same key, while the token would still be
// valid. Whoever else holds the token cannot present the node's key in a
// CSR, which the CA checks is signed by it, so this gives a certificate
// only to the key that already earned one.
func sameEnrollment(tok *store.Token, key string, now time.Time) bool {
	return tok.SpentKey != "" && subtle.ConstantTimeCompare([]byte(tok.SpentKey), []byte(key)) == 1 && tok.ExpiresAt.After(now)
}

// reissue answers a retried enrollment (sameEnrollment) with a new
// certificate for the same key, after the same checks of the instance.
func (s *Service) reissue(ctx context.Context, tok *store.Token, csr *x509.CertificateRequest, now time.Time) (*Issued, error) {
	cert, err := s.CA.SignNode(ctx, csr, tok.InstanceID.String(), s.Lifetime)
	if err != nil {
		return nil, fail.Invalid("csr_pem", "%v", err)
	}
	err = s.Store.Tx(ctx, func(q store.Queries) error {
		return s.issueTx(ctx, q, tok.InstanceID, cert, now, events.EnrollRetried,
			"enrollment retried with its spent token and the same key (its first answer was lost); certificate "+ca.SerialString(cert))
	})
	if err := s.refusal(ctx, tok.InstanceID, now, err); err != nil {
		return nil, err
	}
	return &Issued{InstanceID: tok.InstanceID, Cert: cert}, nil
}

// issueTx checks, inside the enrollment's transaction, that the instance
// may enroll with a token, and records its certificate and the event.
func (s *Service) issueTx(ctx context.Context, q store.Queries, instanceID store.InstanceID, cert *x509.Certificate, now time.Time, kind store.EventKind, msg string) error {
	gate, err := q.EnrollGate(ctx, instanceID)
	if errors.Is(err, store.ErrNotFound) {
		return errTerminated
	}
	if err != nil {
		return err
	}
	if gate.Status == lifecycle.Terminated {
		return errTerminated
	}
	// Rolling back leaves the token unspent: the refusal changes
	// nothing, and the machine with the TPM is not locked out by
	// whoever tried its token.
	if gate.NodeRequiresAttestation {
		return &attestationRequired{"its node requires TPM attestation"}
	}
	if gate.TemplateRequiresAttestation {
		return &attestationRequired{"its template requires TPM attestation"}
	}
	if err := q.CreateCertificate(ctx, s.record(cert, instanceID, now)); err != nil {
		return err
	}
	_, err = events.E{Kind: kind, InstanceID: instanceID, Message: msg,
		Payload: events.EnrolledPayload{NotAfter: cert.NotAfter.UTC().Format(time.RFC3339), Serial: store.CertSerial(ca.SerialString(cert))}}.Write(ctx, q, now)
	return err
}

// refusal turns what an enrollment transaction failed with into the
// answer, recording the refusal (nil: it did not fail).
func (s *Service) refusal(ctx context.Context, instanceID store.InstanceID, now time.Time, err error) error {
	var required *attestationRequired
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errTerminated):
		s.refused(ctx, instanceID, now, "instance is terminated or gone")
		return errRefused
	case errors.As(err, &required):
		s.refused(ctx, instanceID, now, "a token alone is refused: "+required.why)
		return fail.Precondition("enrollment refused: instance %s needs TPM attestation (%s); a token alone is refused. "+
			"Boot the machine whose TPM is bound to the node, or clear require_attestation", instanceID, required.why)
	case errors.Is(err, store.ErrConflict), errors.Is(err, store.ErrNotFound):
		s.refused(ctx, instanceID, now, err.Error())
		return errRefused
	}
	return err
}

// Renew issues a new certificate for the caller's instance, for a fresh key.
func (s *Service) Renew(ctx context.Context, instanceID store.InstanceID, current crypto.PublicKey, csrPEM string) (*Issued, error) {
	if csrPEM == "" {
		return nil, fail.Invalid("csr_pem", "required")
	}
	if len(csrPEM) > MaxCSRBytes {
		return nil, fail.Invalid("csr_pem", "%d bytes is more than the %d a CSR needs", len(csrPEM), MaxCSRBytes)
	}
	csr, err := ca.ParseCSR([]byte(csrPEM))
	if err != nil {
		return nil, fail.Invalid("csr_pem", "%v", err)
	}
	if k, ok := current.(interface{ Equal(crypto.PublicKey) bool }); ok && k.Equal(csr.PublicKey) {
		return nil, fail.Invalid("csr_pem", "renewal needs a fresh key; this CSR reuses the current certificate's key")
	}
	inst, err := s.Store.GetInstance(ctx, instanceID)
	if err != nil {
		return nil, err
	}
	if inst.Status == lifecycle.Terminated {
		return nil, fail.Precondition("instance %s is terminated; it cannot renew its certificate", instanceID)
	}
	now := s.Clock.Now()
	cert, err := s.CA.SignNode(ctx, csr, instanceID.String(), s.Lifetime)
	if err != nil {
		return nil, fail.Invalid("csr_pem", "%v", err)
	}
	err = s.Store.Tx(ctx, func(q store.Queries) error {
		if err := q.CreateCertificate(ctx, s.record(cert, instanceID, now)); err != nil {
			return err
		}
		_, err := events.E{Kind: events.CertRenewed, InstanceID: instanceID, Message: "certificate renewed: " + ca.SerialString(cert),
			Payload: events.RenewedPayload{Serial: store.CertSerial(ca.SerialString(cert))}}.Write(ctx, q, now)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &Issued{InstanceID: instanceID, Cert: cert}, nil
}

func (s *Service) record(cert *x509.Certificate, instanceID store.InstanceID, now time.Time) *store.Certificate {
	return &store.Certificate{Serial: store.CertSerial(ca.SerialString(cert)), InstanceID: instanceID, Kind: store.CertKindNode, Issuer: pki.Fingerprint(s.CA.IssuerOf(cert).Raw),
		Subject: pki.InstanceURI(instanceID.String()).String(), NotBefore: cert.NotBefore, NotAfter: cert.NotAfter, CreatedAt: now}
}

// refusal is what the first refusal of a window recorded, for the
// summary of the rest.
type refusal struct {
	kind       store.EventKind
	severity   store.Severity
	instanceID store.InstanceID
	message    string
}

// reused records a replayed token: somebody holds a secret that was
// already spent, which an operator must look at. Replays of one token are
// coalesced: one event per window, and a summary with the count.
func (s *Service) reused(ctx context.Context, tok *store.Token, now time.Time) {
	var usedAt string
	if tok.UsedAt != nil {
		usedAt = tok.UsedAt.UTC().Format(time.RFC3339)
	}
	s.note(ctx, "reused/"+tok.Hash, now, refusal{kind: events.EnrollTokenReused, severity: events.High, instanceID: tok.InstanceID,
		message: fmt.Sprintf("a bootstrap token of instance %s was presented again after it was used", tok.InstanceID)},
		events.RefusedPayload{Count: 1, UsedAt: usedAt})
}

func (s *Service) refused(ctx context.Context, instanceID store.InstanceID, now time.Time, why string) {
	s.note(ctx, "refused/"+instanceID.String()+"/"+why, now, refusal{kind: events.EnrollRefused, severity: events.Medium, instanceID: instanceID,
		message: "enrollment refused: " + why}, events.RefusedPayload{Count: 1})
}

// note writes the event of a refusal unless one for the same key was
// written this window, in which case it is only counted. p is the
// event's payload, its count 1.
func (s *Service) note(ctx context.Context, key string, now time.Time, r refusal, p events.Payload) {
	write, held := s.refusals().Note(key, now, r)
	if !write {
		return
	}
	if held.Count > 0 {
		s.summary(ctx, held, now)
	}
	s.Log.Warn(r.message, "instance", r.instanceID, "kind", r.kind)
	if _, err := (events.E{Kind: r.kind, Severity: r.severity, InstanceID: r.instanceID, Message: r.message,
		Payload: p}).Write(ctx, s.Store, now); err != nil {
		s.Log.Error("write enrollment refusal event", "kind", r.kind, "instance", r.instanceID, "err", err)
	}
}

// summary writes what a window held back: one event with the count.
func (s *Service) summary(ctx context.Context, sum throttle.Summary, now time.Time) {
	r, _ := sum.Info.(refusal)
	msg := fmt.Sprintf("%s: %d more times from %s to %s", r.message, sum.Count,
		sum.First.UTC().Format(time.RFC3339), sum.Last.UTC().Format(time.RFC3339))
	s.Log.Warn(msg, "instance", r.instanceID, "kind", r.kind, "count", sum.Count)
	if _, err := (events.E{Kind: r.kind, Severity: r.severity, InstanceID: r.instanceID, Message: msg,
		Payload: events.CoalescedPayload{Coalesced: true, Count: sum.Count,
			First: sum.First.UTC().Format(time.RFC3339Nano), Last: sum.Last.UTC().Format(time.RFC3339Nano)}}).Write(ctx, s.Store, now); err != nil {
		s.Log.Error("write coalesced enrollment refusal event", "kind", r.kind, "instance", r.instanceID, "count", sum.Count, "err", err)
	}
}

// FlushRefusals writes the summaries of the refusal windows that have
// ended (all of them when final, at shutdown), so that a burst that
// stopped is still on record with its count.
func (s *Service) FlushRefusals(ctx context.Context, final bool) {
	now := s.Clock.Now()
	for _, sum := range s.refusals().Flush(now, final) {
		s.summary(ctx, sum, now)
	}
}
