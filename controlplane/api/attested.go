package api

import (
	"time"

	"github.com/tetherfleet/tether/controlplane/enroll"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/throttle"
	"github.com/tetherfleet/tether/pki/attestation"
	"github.com/tetherfleet/tether/pki/ca"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
	"google.golang.org/grpc/peer"
)

// AttestTimeout bounds an attested enrollment from its opening to its
// proof. A TPM activates and quotes in well under a second, even a
// software one under emulation; a stream held longer holds a challenge
// and a connection that nobody has proved anything on.
const AttestTimeout = 30 * time.Second

// EnrollAttested implements EnrollmentService: begin, challenge, proof,
// enrolled, on one stream (docs/adr/0023).
func (e *enrollmentServer) EnrollAttested(stream v1.EnrollmentService_EnrollAttestedServer) error {
	ctx := stream.Context()
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		if src := throttle.SourceKey(p.Addr.String()); !e.EnrollLimiter.Allow(src) {
			e.m.RateLimited.WithLabelValues("enroll").Inc()
			e.m.Enrollments.WithLabelValues("rate_limited").Inc()
			return fail.Exhausted("too many enrollment attempts from %s; retry in a few seconds", src)
		}
	}
	timeout := e.AttestTimeout
	if timeout <= 0 {
		timeout = AttestTimeout
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()

	first, err := recvBefore(stream, deadline.C, timeout, "begin")
	if err != nil {
		return err
	}
	b := first.GetBegin()
	if b == nil {
		return fail.Invalid("begin", "the first message of an attested enrollment must be begin")
	}
	pending, c, err := e.Enrollment.BeginAttested(ctx, enroll.Begin{
		InstanceID: store.InstanceID(b.InstanceId), CSRPEM: b.CsrPem, EKPublic: b.EkPublic, EKCertificate: b.EkCertificate,
		AK: akParams(b.Ak),
	})
	if err != nil {
		e.m.Enrollments.WithLabelValues("refused").Inc()
		return err
	}
	if err := stream.Send(&v1.AttestedEnrollResponse{Step: &v1.AttestedEnrollResponse_Challenge{Challenge: &v1.AttestChallenge{
		EnrollmentId: pending.ID, Credential: c.Credential, Secret: c.Secret}}}); err != nil {
		return err
	}
	second, err := recvBefore(stream, deadline.C, timeout, "proof")
	if err != nil {
		return err
	}
	p := second.GetProof()
	if p == nil {
		return fail.Invalid("proof", "the second message of an attested enrollment must be proof")
	}
	issued, err := e.Enrollment.FinishAttested(ctx, pending, p.Secret, evidence(p))
	if err != nil {
		e.m.Enrollments.WithLabelValues("refused").Inc()
		return err
	}
	e.m.Enrollments.WithLabelValues("issued").Inc()
	return stream.Send(&v1.AttestedEnrollResponse{Step: &v1.AttestedEnrollResponse_Enrolled{Enrolled: &v1.EnrollResponse{
		InstanceId: issued.InstanceID.String(), CertificatePem: string(ca.CertPEM(issued.Cert)),
		CaPem: string(ca.CertPEM(e.CA.IssuerOf(issued.Cert))), NotAfter: tsp(issued.Cert.NotAfter), TrustBundle: e.trustBundle()}}})
}

// recvBefore reads one message, or gives up at the deadline: Recv has no
// timeout of its own, and returning ends the stream, which ends the Recv.
func recvBefore(stream v1.EnrollmentService_EnrollAttestedServer, deadline <-chan time.Time, timeout time.Duration, what string) (*v1.AttestedEnrollRequest, error) {
	type got struct {
		m   *v1.AttestedEnrollRequest
		err error
	}
	ch := make(chan got, 1)
	go func() {
		m, err := stream.Recv()
		ch <- got{m, err}
	}()
	select {
	case g := <-ch:
		if g.err != nil {
			return nil, fail.From(g.err)
		}
		return g.m, nil
	case <-deadline:
		return nil, fail.Precondition("attested enrollment took longer than %s; no %s arrived", timeout, what)
	case <-stream.Context().Done():
		return nil, fail.From(stream.Context().Err())
	}
}

func akParams(k *v1.AttestationKey) attestation.AKParams {
	if k == nil {
		return attestation.AKParams{}
	}
	return attestation.AKParams{Public: k.Public, CreateData: k.CreateData, CreateAttestation: k.CreateAttestation, CreateSignature: k.CreateSignature}
}

func evidence(p *v1.AttestProof) attestation.Evidence {
	ev := attestation.Evidence{EventLog: p.EventLog}
	for _, q := range p.Quotes {
		ev.Quotes = append(ev.Quotes, attestation.Quote{Quote: q.GetQuote(), Signature: q.GetSignature()})
	}
	for _, r := range p.Pcrs {
		ev.PCRs = append(ev.PCRs, attestation.PCR{Index: int(r.GetIndex()), Digest: r.GetDigest()})
	}
	return ev
}
