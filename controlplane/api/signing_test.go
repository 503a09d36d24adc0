package api_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/internal/testkit/testcp"
	"github.com/tetherfleet/tether/pki"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

func pushSigned(ctx context.Context, c v1.AdminServiceClient, name, version string, data, raw []byte, sigs ...*v1.ModuleSignature) (*v1.Module, error) {
	stream, err := c.PushModule(ctx)
	if err != nil {
		return nil, err
	}
	if err := stream.Send(&v1.PushModuleRequest{Msg: &v1.PushModuleRequest_Header{Header: &v1.PushModuleHeader{
		Name: name, Version: version, Digest: testcp.Digest(data), Size: int64(len(data)), Signature: raw, Signatures: sigs}}}); err != nil {
		return stream.CloseAndRecv()
	}
	if err := stream.Send(&v1.PushModuleRequest{Msg: &v1.PushModuleRequest_Chunk{Chunk: data}}); err != nil {
		return stream.CloseAndRecv()
	}
	return stream.CloseAndRecv()
}

type signer struct {
	pub  ed25519.PublicKey
	priv ed25519.PrivateKey
	fp   string
}

func newSigner(t *testing.T) signer {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return signer{pub, priv, pki.SignerFingerprint(pub)}
}

func (s signer) sig(name, version, digest string) *v1.ModuleSignature {
	return &v1.ModuleSignature{PublicKey: s.pub, Signature: pki.SignModule(s.priv, name, version, digest)}
}

func wantMsg(t *testing.T, err error, code codes.Code, parts ...string) {
	t.Helper()
	wantCode(t, err, code)
	for _, p := range parts {
		if !strings.Contains(status.Convert(err).Message(), p) {
			t.Fatalf("error %q does not name %q", status.Convert(err).Message(), p)
		}
	}
}

func TestPushVerifiesSignatures(t *testing.T) {
	cp := testcp.Start(t)
	ctx := ctxT(t)
	img := testcp.TinyErofs()
	d := testcp.Digest(img)
	alice, bob := newSigner(t), newSigner(t)

	// No signers configured: a signature cannot be checked, so it is refused.
	_, err := pushSigned(ctx, cp.Admin, "base", "1", img, make([]byte, 64))
	wantMsg(t, err, codes.FailedPrecondition, "no signer keys are configured")
	if _, err := cp.Admin.GetModule(ctx, &v1.GetModuleRequest{Name: "base", Version: "1"}); status.Code(err) != codes.NotFound {
		t.Fatalf("a refused push stored the module: %v", err)
	}

	if _, err := cp.Admin.AddSigner(ctx, &v1.AddSignerRequest{Name: "alice", PublicKey: alice.pub}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		raw   []byte
		sigs  []*v1.ModuleSignature
		code  codes.Code
		parts []string
	}{
		{"all-zero raw signature", make([]byte, 64), nil, codes.InvalidArgument, []string{"verifies with none"}},
		{"all-zero signature by a registered key", nil, []*v1.ModuleSignature{{PublicKey: alice.pub, Signature: make([]byte, 64)}}, codes.InvalidArgument, []string{"does not verify", alice.fp}},
		{"unregistered signer", nil, []*v1.ModuleSignature{bob.sig("base", "1", d)}, codes.FailedPrecondition, []string{bob.fp, "not a registered signer"}},
		{"signature over another digest", nil, []*v1.ModuleSignature{alice.sig("base", "1", testcp.Digest([]byte("x")))}, codes.InvalidArgument, []string{"does not verify"}},
		{"signature over another version", nil, []*v1.ModuleSignature{alice.sig("base", "2", d)}, codes.InvalidArgument, []string{"does not verify"}},
		{"short signature", []byte{1, 2, 3}, nil, codes.InvalidArgument, []string{"header.signature"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := pushSigned(ctx, cp.Admin, "base", "1", img, tt.raw, tt.sigs...)
			wantMsg(t, err, tt.code, tt.parts...)
			if _, err := cp.Admin.GetModule(ctx, &v1.GetModuleRequest{Name: "base", Version: "1"}); status.Code(err) != codes.NotFound {
				t.Fatalf("a refused push stored the module: %v", err)
			}
		})
	}

	// A raw signature finds its signer; a second signer signs later.
	m, err := pushSigned(ctx, cp.Admin, "base", "1", img, pki.SignModule(alice.priv, "base", "1", d))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Signatures) != 1 || m.Signatures[0].Signer != alice.fp || m.Signatures[0].SignerName != "alice" {
		t.Fatalf("signatures = %v, want alice's", m.Signatures)
	}
	_, err = cp.Admin.SignModule(ctx, &v1.SignModuleRequest{Name: "base", Version: "1", Signature: bob.sig("base", "1", d)})
	wantMsg(t, err, codes.FailedPrecondition, bob.fp)
	if _, err := cp.Admin.AddSigner(ctx, &v1.AddSignerRequest{Name: "bob", PublicKey: bob.pub}); err != nil {
		t.Fatal(err)
	}
	_, err = cp.Admin.SignModule(ctx, &v1.SignModuleRequest{Name: "base", Version: "1", Signature: bob.sig("base", "2", d)})
	wantCode(t, err, codes.InvalidArgument)
	if _, err := cp.Admin.SignModule(ctx, &v1.SignModuleRequest{Name: "base", Version: "1", Signature: bob.sig("base", "1", d)}); err != nil {
		t.Fatal(err)
	}
	got, err := cp.Admin.GetModule(ctx, &v1.GetModuleRequest{Name: "base", Version: "1"})
	if err != nil {
		t.Fatal(err)
	}
	signers := map[string]bool{}
	for _, s := range got.Signatures {
		signers[s.Signer] = true
	}
	if len(got.Signatures) != 2 || !signers[alice.fp] || !signers[bob.fp] {
		t.Fatalf("module get lists %v, want alice and bob", got.Signatures)
	}
	_, err = cp.Admin.AddSigner(ctx, &v1.AddSignerRequest{Name: "alice2", PublicKey: alice.pub})
	wantCode(t, err, codes.AlreadyExists)
}

func TestTemplateRequiredSigners(t *testing.T) {
	cp := testcp.Start(t)
	ctx := ctxT(t)
	img := testcp.TinyErofs()
	d := testcp.Digest(img)
	alice, bob := newSigner(t), newSigner(t)
	for _, s := range []struct {
		n string
		k signer
	}{{"alice", alice}, {"bob", bob}} {
		if _, err := cp.Admin.AddSigner(ctx, &v1.AddSignerRequest{Name: s.n, PublicKey: s.k.pub}); err != nil {
			t.Fatal(err)
		}
	}
	cp.PushModule(ctx, "plain", "1", img)
	if _, err := pushSigned(ctx, cp.Admin, "signed", "1", img, nil, bob.sig("signed", "1", d)); err != nil {
		t.Fatal(err)
	}
	_, err := cp.Admin.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: "t", RootModules: []*v1.ModuleRef{{Name: "plain", Version: "1"}}, RequiredSigners: []string{"sha256:nothex"}})
	wantMsg(t, err, codes.InvalidArgument, "required_signers")
	_, err = cp.Admin.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: "t", RootModules: []*v1.ModuleRef{{Name: "plain", Version: "1"}}, RequiredSigners: []string{alice.fp}})
	wantMsg(t, err, codes.FailedPrecondition, "plain:1", "unsigned", alice.fp)
	_, err = cp.Admin.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: "t", RootModules: []*v1.ModuleRef{{Name: "signed", Version: "1"}}, RequiredSigners: []string{alice.fp}})
	wantMsg(t, err, codes.FailedPrecondition, "signed:1", alice.fp)
	tpl, err := cp.Admin.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: "t", RootModules: []*v1.ModuleRef{{Name: "signed", Version: "1"}}, RequiredSigners: []string{alice.fp, bob.fp}})
	if err != nil {
		t.Fatal(err)
	}
	if len(tpl.RequiredSigners) != 2 {
		t.Fatalf("required signers = %v", tpl.RequiredSigners)
	}
	// An update cannot slip an unsigned module under the requirement.
	_, err = cp.Admin.UpdateTemplate(ctx, &v1.UpdateTemplateRequest{Name: "t", UpdateMask: []string{"root_modules"}, RootModules: []*v1.ModuleRef{{Name: "plain", Version: "1"}}})
	wantMsg(t, err, codes.FailedPrecondition, "plain:1")
	if _, err := cp.Admin.CreateNode(ctx, &v1.CreateNodeRequest{Name: "n", Template: "t"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Admin.ProvisionInstance(ctx, &v1.ProvisionInstanceRequest{Node: "n", Provider: "external"}); err != nil {
		t.Fatal(err)
	}
	// The assignment carries the requirement for the node.
	_, tok := cp.Provision(ctx, "n")
	key := testcp.NewNodeKey(t)
	resp, err := v1.NewEnrollmentServiceClient(cp.Dial(nil)).Enroll(ctx, &v1.EnrollRequest{Token: tok, CsrPem: key.CSRPEM})
	if err != nil {
		t.Fatal(err)
	}
	node := key.Certificate(t, resp.CertificatePem)
	asg, err := v1.NewAgentServiceClient(cp.Dial(&node)).GetAssignment(ctx, &v1.GetAssignmentRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(asg.RequiredSigners) != 2 || len(asg.RootModules[0].Signatures) != 1 || asg.RootModules[0].Signatures[0].Signer != bob.fp {
		t.Fatalf("assignment = %v", asg)
	}
}
