package api

// What templates and module pushes share with signing; the signer RPCs
// themselves are in admin/signers.

import (
	"context"

	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/pki"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

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
