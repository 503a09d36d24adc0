package e2e

import (
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/pki"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// A template's required signer reaches the VM through fw_cfg as its
// anchor; the module its signer signed boots.
func TestVMSignedByAnchoredKey(t *testing.T) {
	env := newVMEnv(t)
	ctx := vmCtx(t)
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	fp := pki.SignerFingerprint(pub)
	if _, err := env.cp.Admin.AddSigner(ctx, &v1.AddSignerRequest{Name: "release", PublicKey: pub}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(env.a.rootModule)
	if err != nil {
		t.Fatal(err)
	}
	m := env.cp.PushModule(ctx, "example", "signed", data)
	if _, err := env.cp.Admin.SignModule(ctx, &v1.SignModuleRequest{Name: "example", Version: "signed",
		Signature: &v1.ModuleSignature{PublicKey: pub, Signature: pki.SignModule(key, "example", "signed", m.Digest)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.cp.Admin.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: "signed", RequiredSigners: []string{fp},
		RootModules: []*v1.ModuleRef{{Name: "example", Version: "signed"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.cp.Admin.CreateNode(ctx, &v1.CreateNodeRequest{Name: "signed", Template: "signed"}); err != nil {
		t.Fatal(err)
	}
	env.node = "signed"
	id := env.provision(t, ctx)
	env.waitRunning(t, ctx, id, nil)
	if console := env.console(ctx, id); !strings.Contains(console, "signer anchor "+fp+" (1 from QEMU fw_cfg)") {
		t.Errorf("the console does not show the anchor from fw_cfg:\n%s", tail(console, 3000))
	}
}

// An anchor on the kernel command line the control plane does not check:
// the unsigned module is refused, with a console line and an event, and
// the node never switches into it.
func TestVMUnsignedRefusedByAnchor(t *testing.T) {
	env := newVMEnv(t)
	ctx := vmCtx(t)
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	fp := pki.SignerFingerprint(pub)
	if _, err := env.cp.Admin.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: "anchored", KernelArgs: "tether.signers=" + fp,
		RootModules: []*v1.ModuleRef{{Name: "example", Version: "1"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.cp.Admin.CreateNode(ctx, &v1.CreateNodeRequest{Name: "anchored", Template: "anchored"}); err != nil {
		t.Fatal(err)
	}
	env.node = "anchored"
	id := env.provision(t, ctx)
	deadline := time.Now().Add(bootTimeout)
	for {
		in, err := env.cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: id})
		if err == nil && strings.Contains(in.AgentError, "module.signature_refused: module example:1 refused") {
			if in.Status == v1.InstanceStatus_INSTANCE_STATUS_RUNNING {
				t.Fatal("a node running an unsigned module under an anchor")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the refusal was never reported; last %v\nconsole:\n%s", in, tail(env.console(ctx, id), 4000))
		}
		time.Sleep(250 * time.Millisecond)
	}
	evs, err := env.cp.Admin.ListEvents(ctx, &v1.ListEventsRequest{Kind: "module.signature_refused", InstanceId: id})
	if err != nil || len(evs.Events) == 0 {
		t.Errorf("no module.signature_refused event: %v %v", evs, err)
	}
	console := env.console(ctx, id)
	if !strings.Contains(console, "REFUSED: module.signature_refused: module example:1 refused: node signer anchor: unsigned") {
		t.Errorf("the console does not name the module and the reason:\n%s", tail(console, 3000))
	}
	if strings.Contains(console, "phase switching") || strings.Contains(console, "TETHER_EXAMPLE_READY") {
		t.Errorf("the node switched into a refused root:\n%s", tail(console, 3000))
	}
}
