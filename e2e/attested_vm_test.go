package e2e

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/swtpmtest"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
	"github.com/tetherfleet/tether/providers/qemu"
)

// TestVMAttestedEnrollment is issue 28 on real VMs, each with its own
// swtpm: a node whose EK is registered boots to running with no token
// anywhere (not in fw_cfg, not on the command line); the same node with
// another TPM is refused, with a high-severity event naming both EKs; a
// token for a node that requires attestation is refused.
func TestVMAttestedEnrollment(t *testing.T) {
	swtpmtest.Require(t)
	env := newVMEnv(t, testcp.With(func(o *daemon.ServeOptions) { o.Providers.QEMU.TPM = true }))
	ctx := vmCtx(t)

	tpmDir := qemu.TPMDir(env.stateDir, env.node)
	ek, err := qemu.PrepareTPM(tpmDir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.cp.Admin.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: env.node, UpdateMask: []string{"ek_hashes", "require_attestation"},
		EkHashes: []string{ek}, RequireAttestation: true}); err != nil {
		t.Fatal(err)
	}

	id := env.provision(t, ctx)
	if in := env.waitRunning(t, ctx, id, nil); in.TpmEkHash != "" && in.TpmEkHash != ek {
		t.Errorf("ListInstances view shows EK %s, want %s", in.TpmEkHash, ek)
	}
	if in, err := env.cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: id}); err != nil || in.TpmEkHash != ek {
		t.Errorf("instance view: EK %q (%v), want the TPM's %s", in.GetTpmEkHash(), err, ek)
	}
	argv := qemuArgv(t, id)
	for _, bad := range []string{"opt/tether/token", "tether.token", "tbt_"} {
		if strings.Contains(argv, bad) {
			t.Errorf("the VM of a node with a registered EK was handed a token (%q in its command line): %s", bad, argv)
		}
	}
	if !strings.Contains(argv, "name=opt/tether/instance,string="+id) {
		t.Errorf("the VM was not told its instance: %s", argv)
	}
	if got := env.events(t, ctx, "enroll.succeeded", id); len(got) != 1 || !strings.Contains(got[0].Message, "TPM attestation (EK "+ek+")") {
		t.Fatalf("enroll.succeeded events %v, want one saying it was by attestation with EK %s", got, ek)
	}
	if c := env.console(ctx, id); !strings.Contains(c, "by TPM attestation") {
		t.Errorf("the console does not say how the agent enrolled:\n%s", tail(c, 2000))
	}
	if _, err := env.cp.Admin.TerminateInstance(ctx, &v1.InstanceActionRequest{Id: id}); err != nil {
		t.Fatal(err)
	}

	// Another TPM in the same node: a board swapped, or a machine that
	// claims to be this one.
	if err := os.RemoveAll(tpmDir); err != nil {
		t.Fatal(err)
	}
	other, err := qemu.PrepareTPM(tpmDir)
	if err != nil {
		t.Fatal(err)
	}
	if other == ek {
		t.Fatal("a fresh TPM state has the same EK")
	}
	id2 := env.provision(t, ctx)
	deadline := time.Now().Add(bootTimeout)
	var refused []*v1.FleetEvent
	for time.Now().Before(deadline) && len(refused) == 0 {
		refused = env.events(t, ctx, "enroll.ek_mismatch", id2)
		time.Sleep(500 * time.Millisecond)
	}
	if len(refused) == 0 {
		t.Fatalf("no enroll.ek_mismatch event for a node booted with another TPM\nconsole:\n%s", tail(env.console(ctx, id2), 3000))
	}
	if msg := refused[0].Message; !strings.Contains(msg, ek) || !strings.Contains(msg, other) || refused[0].Severity != v1.Severity_SEVERITY_HIGH {
		t.Errorf("event %q (severity %v), want high severity naming %s and %s", msg, refused[0].Severity, ek, other)
	}
	if certs := env.certs(t, ctx, id2); len(certs) != 0 {
		t.Errorf("the machine with another TPM got %d certificates", len(certs))
	}
	if _, err := env.cp.Admin.TerminateInstance(ctx, &v1.InstanceActionRequest{Id: id2}); err != nil {
		t.Fatal(err)
	}

	// A token, from a machine without the TPM (this test), for the node
	// that requires attestation.
	id3 := env.provision(t, ctx)
	tok, err := env.cp.Admin.CreateBootstrapToken(ctx, &v1.CreateBootstrapTokenRequest{InstanceId: id3})
	if err != nil {
		t.Fatal(err)
	}
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	_, err = v1.NewEnrollmentServiceClient(env.cp.Dial(nil)).Enroll(ctx, &v1.EnrollRequest{Token: tok.Token,
		CsrPem: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "attestation") {
		t.Fatalf("token enrollment for a node that requires attestation: %v, want FailedPrecondition saying attestation is required", err)
	}
}

// qemuArgv is the command line of an instance's VM process.
func qemuArgv(t *testing.T, id string) string {
	t.Helper()
	pid := qemuPID(id)
	if pid == "" {
		t.Fatalf("no VM process for %s", id)
	}
	b, err := os.ReadFile("/proc/" + strings.Fields(pid)[0] + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	return strings.ReplaceAll(string(b), "\x00", " ")
}
