// Package credentials serves the BMC credential RPCs of AdminService:
// named user names and passwords that open machines' BMCs. The listing
// shows names and user names, never passwords. controlplane/credentials
// seals and stores them; these handlers check the request's shape and
// convert.
package credentials

import (
	"context"

	"github.com/tetherfleet/tether/controlplane/api/admin/adminkit"
	bmccreds "github.com/tetherfleet/tether/controlplane/credentials"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/store"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// Config is what the credential RPCs use.
type Config struct {
	// Credentials stores BMC credentials (nil: every RPC answers
	// FailedPrecondition, for a control plane without a credential key).
	Credentials *bmccreds.Service
}

// Server serves the credential RPCs.
type Server struct {
	cfg Config
}

// New builds the credential RPCs; without a credential store they refuse.
func New(cfg Config) (*Server, error) { return &Server{cfg: cfg}, nil }

func (a *Server) needCredentials() error {
	if a.cfg.Credentials == nil {
		return fail.Precondition("this control plane has no credential store configured")
	}
	return nil
}

func credentialProto(c *store.Credential) *v1.Credential {
	return &v1.Credential{Name: c.Name, Username: c.Username, CreatedAt: adminkit.Timestamp(c.CreatedAt), UpdatedAt: adminkit.Timestamp(c.UpdatedAt)}
}

// CreateCredential implements AdminService.
func (a *Server) CreateCredential(ctx context.Context, req *v1.CreateCredentialRequest) (*v1.Credential, error) {
	if err := a.needCredentials(); err != nil {
		return nil, err
	}
	if err := modules.ValidateName("name", req.Name); err != nil {
		return nil, err
	}
	c, err := a.cfg.Credentials.Create(ctx, req.Name, req.Username, []byte(req.Password))
	if err != nil {
		return nil, err
	}
	return credentialProto(c), nil
}

// UpdateCredential implements AdminService.
func (a *Server) UpdateCredential(ctx context.Context, req *v1.UpdateCredentialRequest) (*v1.Credential, error) {
	if err := a.needCredentials(); err != nil {
		return nil, err
	}
	if req.Name == "" {
		return nil, fail.Invalid("name", "required")
	}
	c, err := a.cfg.Credentials.Update(ctx, req.Name, req.Username, []byte(req.Password))
	if err != nil {
		return nil, err
	}
	return credentialProto(c), nil
}

// ListCredentials implements AdminService.
func (a *Server) ListCredentials(ctx context.Context, _ *v1.ListCredentialsRequest) (*v1.ListCredentialsResponse, error) {
	if err := a.needCredentials(); err != nil {
		return nil, err
	}
	cs, err := a.cfg.Credentials.List(ctx)
	if err != nil {
		return nil, err
	}
	out := &v1.ListCredentialsResponse{}
	for _, c := range cs {
		out.Credentials = append(out.Credentials, credentialProto(c))
	}
	return out, nil
}

// DeleteCredential implements AdminService.
func (a *Server) DeleteCredential(ctx context.Context, req *v1.DeleteCredentialRequest) (*v1.DeleteCredentialResponse, error) {
	if err := a.needCredentials(); err != nil {
		return nil, err
	}
	if req.Name == "" {
		return nil, fail.Invalid("name", "required")
	}
	if err := a.cfg.Credentials.Delete(ctx, req.Name); err != nil {
		return nil, err
	}
	return &v1.DeleteCredentialResponse{}, nil
}
