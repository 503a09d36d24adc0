package api

import (
	"context"

	"github.com/tetherfleet/tether/controlplane/carotation"
	"github.com/tetherfleet/tether/controlplane/fail"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// CA rotation (design §3.10): the handlers check the input's shape and
// delegate; controlplane/carotation refuses a step the set's state does
// not allow, names that state, and writes the step's event.

func (a *adminServer) cas() (*carotation.Service, error) {
	if a.CAs == nil {
		return nil, fail.Precondition("this control plane has no CA rotation set")
	}
	return a.CAs, nil
}

func caProto(c *carotation.CA) *v1.CertificateAuthority {
	return &v1.CertificateAuthority{Fingerprint: c.Fingerprint, State: c.State, NotAfter: tsp(c.NotAfter), LiveCertificates: int64(c.Live),
		Subject: c.Subject, CreatedAt: tsp(c.CreatedAt), UpdatedAt: tsp(c.UpdatedAt), CertificatePem: c.CertPEM}
}

func (a *adminServer) by(ctx context.Context) string {
	c, _ := CallerFrom(ctx)
	return c.Identity.Name
}

// PrepareCA implements AdminService.
func (a *adminServer) PrepareCA(ctx context.Context, req *v1.PrepareCARequest) (*v1.CertificateAuthority, error) {
	s, err := a.cas()
	if err != nil {
		return nil, err
	}
	c, err := s.Prepare(ctx, req.KeyType, a.by(ctx))
	if err != nil {
		return nil, err
	}
	return caProto(c), nil
}

// ActivateCA implements AdminService.
func (a *adminServer) ActivateCA(ctx context.Context, req *v1.ActivateCARequest) (*v1.CertificateAuthority, error) {
	s, err := a.cas()
	if err != nil {
		return nil, err
	}
	c, err := s.Activate(ctx, req.Fingerprint, a.by(ctx))
	if err != nil {
		return nil, err
	}
	return caProto(c), nil
}

// RetireCA implements AdminService.
func (a *adminServer) RetireCA(ctx context.Context, req *v1.RetireCARequest) (*v1.CertificateAuthority, error) {
	if req.Fingerprint == "" {
		return nil, fail.Invalid("fingerprint", "required: the CA to retire (`tetherctl ca list`)")
	}
	s, err := a.cas()
	if err != nil {
		return nil, err
	}
	c, err := s.Retire(ctx, req.Fingerprint, a.by(ctx))
	if err != nil {
		return nil, err
	}
	return caProto(c), nil
}

// ListCAs implements AdminService.
func (a *adminServer) ListCAs(ctx context.Context, _ *v1.ListCAsRequest) (*v1.ListCAsResponse, error) {
	s, err := a.cas()
	if err != nil {
		return nil, err
	}
	all, err := s.List(ctx)
	if err != nil {
		return nil, err
	}
	out := &v1.ListCAsResponse{}
	for i := range all {
		out.Authorities = append(out.Authorities, caProto(&all[i]))
	}
	return out, nil
}
