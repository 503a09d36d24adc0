// Package signers serves the module signer RPCs of AdminService: the
// Ed25519 keys module signatures verify with, and signing a stored module.
// controlplane/modules keeps the signers and checks signatures; these
// handlers check the request's shape and convert.
package signers

import (
	"context"
	"crypto/ed25519"
	"errors"

	"github.com/tetherfleet/tether/controlplane/api/admin/adminkit"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/store"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// Config is what the signer RPCs use.
type Config struct {
	// Registry keeps the signers and the modules they sign (required).
	Registry *modules.Registry
}

// Server serves the signer RPCs.
type Server struct {
	cfg Config
}

// New builds the signer RPCs.
func New(cfg Config) (*Server, error) {
	if cfg.Registry == nil {
		return nil, errors.New("signers: Config.Registry is required")
	}
	return &Server{cfg: cfg}, nil
}

// AddSigner implements AdminService.
func (a *Server) AddSigner(ctx context.Context, req *v1.AddSignerRequest) (*v1.Signer, error) {
	if err := modules.ValidateName("name", req.Name); err != nil {
		return nil, err
	}
	if len(req.PublicKey) != ed25519.PublicKeySize {
		return nil, fail.Invalid("public_key", "an Ed25519 public key is %d bytes, got %d", ed25519.PublicKeySize, len(req.PublicKey))
	}
	s, err := a.cfg.Registry.AddSigner(ctx, req.Name, req.PublicKey)
	if err != nil {
		return nil, err
	}
	return signerProto(s), nil
}

// ListSigners implements AdminService.
func (a *Server) ListSigners(ctx context.Context, _ *v1.ListSignersRequest) (*v1.ListSignersResponse, error) {
	ss, err := a.cfg.Registry.Signers(ctx)
	if err != nil {
		return nil, err
	}
	out := &v1.ListSignersResponse{}
	for i := range ss {
		out.Signers = append(out.Signers, signerProto(&ss[i]))
	}
	return out, nil
}

// RemoveSigner implements AdminService.
func (a *Server) RemoveSigner(ctx context.Context, req *v1.RemoveSignerRequest) (*v1.RemoveSignerResponse, error) {
	if req.Signer == "" {
		return nil, fail.Invalid("signer", "required (a signer name or its sha256: fingerprint)")
	}
	if err := a.cfg.Registry.RemoveSigner(ctx, req.Signer); err != nil {
		return nil, err
	}
	return &v1.RemoveSignerResponse{}, nil
}

// SignModule implements AdminService.
func (a *Server) SignModule(ctx context.Context, req *v1.SignModuleRequest) (*v1.Module, error) {
	if req.Signature == nil {
		return nil, fail.Invalid("signature", "required")
	}
	m, err := a.cfg.Registry.Sign(ctx, req.Name, req.Version, modules.SignatureIn{PublicKey: req.Signature.PublicKey, Signature: req.Signature.Signature})
	if err != nil {
		return nil, err
	}
	return adminkit.ModuleProto(m), nil
}

func signerProto(s *store.Signer) *v1.Signer {
	return &v1.Signer{Name: s.Name, Fingerprint: s.Fingerprint, PublicKey: s.PublicKey, CreatedAt: adminkit.Timestamp(s.CreatedAt)}
}
