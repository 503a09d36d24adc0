package api

import (
	"context"
	"crypto/ed25519"
	"errors"

	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/pki"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

func (a *adminServer) AddSigner(ctx context.Context, req *v1.AddSignerRequest) (*v1.Signer, error) {
	if err := modules.ValidateName("name", req.Name); err != nil {
		return nil, err
	}
	if len(req.PublicKey) != ed25519.PublicKeySize {
		return nil, fail.Invalid("public_key", "an Ed25519 public key is %d bytes, got %d", ed25519.PublicKeySize, len(req.PublicKey))
	}
	s := &store.Signer{Name: req.Name, Fingerprint: pki.SignerFingerprint(req.PublicKey), PublicKey: req.PublicKey, CreatedAt: a.Clock.Now()}
	err := a.Store.Tx(ctx, func(q store.Queries) error { return q.CreateSigner(ctx, s) })
	if errors.Is(err, store.ErrAlreadyExists) {
		return nil, fail.Exists("a signer named %q or with fingerprint %s is already registered", s.Name, s.Fingerprint)
	}
	if err != nil {
		return nil, err
	}
	return signerProto(s), nil
}

func (a *adminServer) ListSigners(ctx context.Context, _ *v1.ListSignersRequest) (*v1.ListSignersResponse, error) {
	ss, err := a.Registry.Signers(ctx)
	if err != nil {
		return nil, err
	}
	out := &v1.ListSignersResponse{}
	for i := range ss {
		out.Signers = append(out.Signers, signerProto(&ss[i]))
	}
	return out, nil
}

func (a *adminServer) RemoveSigner(ctx context.Context, req *v1.RemoveSignerRequest) (*v1.RemoveSignerResponse, error) {
	if req.Signer == "" {
		return nil, fail.Invalid("signer", "required (a signer name or its sha256: fingerprint)")
	}
	if err := a.Store.Tx(ctx, func(q store.Queries) error { return q.DeleteSigner(ctx, req.Signer) }); err != nil {
		return nil, err
	}
	return &v1.RemoveSignerResponse{}, nil
}

func (a *adminServer) SignModule(ctx context.Context, req *v1.SignModuleRequest) (*v1.Module, error) {
	if req.Signature == nil {
		return nil, fail.Invalid("signature", "required")
	}
	m, err := a.Registry.Sign(ctx, req.Name, req.Version, modules.SignatureIn{PublicKey: req.Signature.PublicKey, Signature: req.Signature.Signature})
	if err != nil {
		return nil, err
	}
	return moduleProto(m), nil
}

func signerProto(s *store.Signer) *v1.Signer {
	return &v1.Signer{Name: s.Name, Fingerprint: s.Fingerprint, PublicKey: s.PublicKey, CreatedAt: tsp(s.CreatedAt)}
}

func signaturesIn(in []*v1.ModuleSignature) []modules.SignatureIn {
	var out []modules.SignatureIn
	for _, s := range in {
		out = append(out, modules.SignatureIn{PublicKey: s.GetPublicKey(), Signature: s.GetSignature()})
	}
	return out
}

func parseRequiredSigners(in []string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for i, s := range in {
		fp, err := pki.ParseSignerFingerprint(s)
		if err != nil {
			return nil, fail.Invalid("required_signers", "[%d]: %v", i, err)
		}
		if !seen[fp] {
			seen[fp], out = true, append(out, fp)
		}
	}
	return out, nil
}

func checkTemplateSigners(ctx context.Context, q store.Queries, t *store.Template) error {
	return modules.CheckTemplateSigners(ctx, q, t)
}
