// Package ca serves the CA rotation RPCs of AdminService (design §3.10):
// the handlers check the input's shape and delegate; controlplane/carotation
// refuses a step the set's state does not allow, names that state, and
// writes the step's event.
package ca

import (
	"context"

	"github.com/tetherfleet/tether/controlplane/api/admin/adminkit"
	"github.com/tetherfleet/tether/controlplane/carotation"
	"github.com/tetherfleet/tether/controlplane/fail"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// Config is what the CA rotation RPCs use.
type Config struct {
	// CAs is the CA rotation set (nil: every RPC answers
	// FailedPrecondition, for a control plane without one).
	CAs *carotation.Service
}

// Server serves the CA rotation RPCs.
type Server struct {
	cfg Config
}

// New builds the CA rotation RPCs; without a rotation set they refuse.
func New(cfg Config) (*Server, error) { return &Server{cfg: cfg}, nil }

func (a *Server) cas() (*carotation.Service, error) {
	if a.cfg.CAs == nil {
		return nil, fail.Precondition("this control plane has no CA rotation set")
	}
	return a.cfg.CAs, nil
}

func caProto(c *carotation.CA) *v1.CertificateAuthority {
	return &v1.CertificateAuthority{Fingerprint: c.Fingerprint, State: c.State, NotAfter: adminkit.Timestamp(c.NotAfter), LiveCertificates: int64(c.Live),
		Subject: c.Subject, CreatedAt: adminkit.Timestamp(c.CreatedAt), UpdatedAt: adminkit.Timestamp(c.UpdatedAt), CertificatePem: c.CertPEM}
}

// PrepareCA implements AdminService.
func (a *Server) PrepareCA(ctx context.Context, req *v1.PrepareCARequest) (*v1.CertificateAuthority, error) {
	s, err := a.cas()
	if err != nil {
		return nil, err
	}
	c, err := s.Prepare(ctx, req.KeyType, adminkit.By(ctx))
	if err != nil {
		return nil, err
	}
	return caProto(c), nil
}

// ActivateCA implements AdminService.
func (a *Server) ActivateCA(ctx context.Context, req *v1.ActivateCARequest) (*v1.CertificateAuthority, error) {
	s, err := a.cas()
	if err != nil {
		return nil, err
	}
	c, err := s.Activate(ctx, req.Fingerprint, adminkit.By(ctx))
	if err != nil {
		return nil, err
	}
	return caProto(c), nil
}

// RetireCA implements AdminService.
func (a *Server) RetireCA(ctx context.Context, req *v1.RetireCARequest) (*v1.CertificateAuthority, error) {
	if req.Fingerprint == "" {
		return nil, fail.Invalid("fingerprint", "required: the CA to retire (`tetherctl ca list`)")
	}
	s, err := a.cas()
	if err != nil {
		return nil, err
	}
	c, err := s.Retire(ctx, req.Fingerprint, adminkit.By(ctx))
	if err != nil {
		return nil, err
	}
	return caProto(c), nil
}

// ListCAs implements AdminService.
func (a *Server) ListCAs(ctx context.Context, _ *v1.ListCAsRequest) (*v1.ListCAsResponse, error) {
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
