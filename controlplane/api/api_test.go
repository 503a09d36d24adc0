package api_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net/url"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	"github.com/tetherfleet/tether/pki"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func wantCode(t *testing.T, err error, code codes.Code) {
	t.Helper()
	if got := status.Code(err); got != code {
		t.Fatalf("got %v (%v), want %v", got, err, code)
	}
}

// snapshot is what "the store is unchanged" compares.
type snapshot struct {
	certs, instances, tasks, modules int
}

func snap(t *testing.T, cp *testcp.ControlPlane) snapshot {
	ctx := ctxT(t)
	certs, err := cp.Admin.ListCertificates(ctx, &v1.ListCertificatesRequest{PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	ins, err := cp.Admin.ListInstances(ctx, &v1.ListInstancesRequest{PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	ts, err := cp.Admin.ListTasks(ctx, &v1.ListTasksRequest{PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	ms, err := cp.Admin.ListModules(ctx, &v1.ListModulesRequest{PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return snapshot{len(certs.Certificates), len(ins.Instances), len(ts.Tasks), len(ms.Modules)}
}

func TestEnrollAndRenewOverTLS(t *testing.T) {
	cp := testcp.Start(t)
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "edge")
	inst, token := cp.Provision(ctx, fleet.Node)
	if inst.Status != v1.InstanceStatus_INSTANCE_STATUS_PROVISIONING || token == "" {
		t.Fatalf("external provision: %v, token %q", inst.Status, token)
	}

	enroll := v1.NewEnrollmentServiceClient(cp.Dial(nil))
	key := testcp.NewNodeKey(t)
	resp, err := enroll.Enroll(ctx, &v1.EnrollRequest{Token: token, CsrPem: key.CSRPEM})
	if err != nil {
		t.Fatal(err)
	}
	cert := key.Certificate(t, resp.CertificatePem)
	id, err := pki.IdentityOf(cert.Leaf)
	if err != nil || id.Kind != pki.KindInstance || id.Name != inst.Id || resp.InstanceId != inst.Id {
		t.Fatalf("identity %+v (%v), want instance %s", id, err, inst.Id)
	}
	if life := cert.Leaf.NotAfter.Sub(time.Now()); life < 23*time.Hour || life > 24*time.Hour {
		t.Fatalf("certificate lifetime %v, want 24h", life)
	}

	agent := v1.NewAgentServiceClient(cp.Dial(&cert))
	as, err := agent.GetAssignment(ctx, &v1.GetAssignmentRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(as.RootModules) != 1 || as.InstanceId != inst.Id {
		t.Fatalf("assignment %+v", as)
	}

	// Renew needs a fresh key.
	_, err = agent.Renew(ctx, &v1.RenewRequest{CsrPem: key.CSRPEM})
	wantCode(t, err, codes.InvalidArgument)
	fresh := testcp.NewNodeKey(t)
	rr, err := agent.Renew(ctx, &v1.RenewRequest{CsrPem: fresh.CSRPEM})
	if err != nil {
		t.Fatal(err)
	}
	renewed := fresh.Certificate(t, rr.CertificatePem)
	if renewed.Leaf.SerialNumber.Cmp(cert.Leaf.SerialNumber) == 0 {
		t.Fatal("renewal returned the same certificate")
	}
	if _, err := v1.NewAgentServiceClient(cp.Dial(&renewed)).GetAssignment(ctx, &v1.GetAssignmentRequest{}); err != nil {
		t.Fatalf("renewed certificate refused: %v", err)
	}
	certs, err := cp.Admin.ListCertificates(ctx, &v1.ListCertificatesRequest{InstanceId: inst.Id})
	if err != nil || len(certs.Certificates) != 2 {
		t.Fatalf("certificates recorded: %v %v", certs, err)
	}
}

func TestEnrollmentBadInputChangesNothing(t *testing.T) {
	clk := clock.NewFake(time.Now())
	cp := testcp.Start(t, testcp.WithClock(clk))
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "edge")
	inst, token := cp.Provision(ctx, fleet.Node)
	other, _ := cp.Provision(ctx, fleet.Node)
	enroll := v1.NewEnrollmentServiceClient(cp.Dial(nil))

	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	otherURI, _ := url.Parse("tether://instance/" + other.Id)
	adminURI, _ := url.Parse("tether://admin/root?role=admin")

	tests := []struct {
		name  string
		token string
		csr   string
		code  codes.Code
	}{
		{"garbage CSR", token, "-----BEGIN CERTIFICATE REQUEST-----\nZ2FyYmFnZQ==\n-----END CERTIFICATE REQUEST-----\n", codes.InvalidArgument},
		{"not PEM at all", token, "hello", codes.InvalidArgument},
		{"blank CSR", token, "", codes.InvalidArgument},
		{"bad signature", token, badSignature(t, testcp.NewNodeKey(t).CSRPEM), codes.InvalidArgument},
		{"RSA key", token, testcp.CSR(t, rsaKey, &x509.CertificateRequest{}), codes.InvalidArgument},
		{"ECDSA key", token, testcp.CSR(t, ecKey, &x509.CertificateRequest{}), codes.InvalidArgument},
		{"names another instance", token, testcp.CSR(t, edKey, &x509.CertificateRequest{URIs: []*url.URL{otherURI}}), codes.InvalidArgument},
		{"names an admin", token, testcp.CSR(t, edKey, &x509.CertificateRequest{URIs: []*url.URL{adminURI}}), codes.InvalidArgument},
		{"asks for a DNS name", token, testcp.CSR(t, edKey, &x509.CertificateRequest{DNSNames: []string{"tetherd"}}), codes.InvalidArgument},
		{"common name of another", token, testcp.CSR(t, edKey, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "root"}}), codes.InvalidArgument},
		{"unknown token", pki.TokenPrefix + strings.Repeat("A", 43), testcp.NewNodeKey(t).CSRPEM, codes.Unauthenticated},
		{"malformed token", "not-a-token", testcp.NewNodeKey(t).CSRPEM, codes.Unauthenticated},
		{"blank token", "", testcp.NewNodeKey(t).CSRPEM, codes.InvalidArgument},
	}
	before := snap(t, cp)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := enroll.Enroll(ctx, &v1.EnrollRequest{Token: tc.token, CsrPem: tc.csr})
			wantCode(t, err, tc.code)
			if tc.code == codes.InvalidArgument && !strings.Contains(status.Convert(err).Message(), "csr_pem") && !strings.Contains(status.Convert(err).Message(), "token") {
				t.Fatalf("InvalidArgument must name the field: %v", err)
			}
			if after := snap(t, cp); after != before {
				t.Fatalf("store changed: %+v -> %+v", before, after)
			}
		})
	}

	// The token survived every refusal above: it still enrolls, once.
	key := testcp.NewNodeKey(t)
	if _, err := enroll.Enroll(ctx, &v1.EnrollRequest{Token: token, CsrPem: key.CSRPEM}); err != nil {
		t.Fatalf("the token was spent by a refused request: %v", err)
	}
	afterEnroll := snap(t, cp)

	_, err := enroll.Enroll(ctx, &v1.EnrollRequest{Token: token, CsrPem: testcp.NewNodeKey(t).CSRPEM})
	wantCode(t, err, codes.Unauthenticated)
	reuseMsg := status.Convert(err).Message()
	evs, err := cp.Admin.ListEvents(ctx, &v1.ListEventsRequest{Kind: "enroll.token_reused", InstanceId: inst.Id})
	if err != nil || len(evs.Events) != 1 || evs.Events[0].Severity != v1.Severity_SEVERITY_HIGH {
		t.Fatalf("a reused token must raise one high event: %v %v", evs, err)
	}

	// An expired token gets the same answer as an unknown one.
	tok, err := cp.Admin.CreateBootstrapToken(ctx, &v1.CreateBootstrapTokenRequest{InstanceId: other.Id, TtlSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Minute)
	_, err = enroll.Enroll(ctx, &v1.EnrollRequest{Token: tok.Token, CsrPem: testcp.NewNodeKey(t).CSRPEM})
	wantCode(t, err, codes.Unauthenticated)
	_, unknownErr := enroll.Enroll(ctx, &v1.EnrollRequest{Token: pki.TokenPrefix + strings.Repeat("B", 43), CsrPem: testcp.NewNodeKey(t).CSRPEM})
	if status.Convert(err).Message() != status.Convert(unknownErr).Message() || reuseMsg != status.Convert(err).Message() {
		t.Fatal("expired, unknown and reused tokens must be refused with the same message")
	}
	if after := snap(t, cp); after != afterEnroll {
		t.Fatalf("refused enrollments changed the store: %+v -> %+v", afterEnroll, after)
	}
}

func TestAuthorization(t *testing.T) {
	clk := clock.NewFake(time.Now())
	cp := testcp.Start(t, testcp.WithClock(clk))
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "edge")
	_, token := cp.Provision(ctx, fleet.Node)
	key := testcp.NewNodeKey(t)
	resp, err := v1.NewEnrollmentServiceClient(cp.Dial(nil)).Enroll(ctx, &v1.EnrollRequest{Token: token, CsrPem: key.CSRPEM})
	if err != nil {
		t.Fatal(err)
	}
	node := key.Certificate(t, resp.CertificatePem)

	// No client certificate: admin and agent calls are Unauthenticated.
	_, err = v1.NewAdminServiceClient(cp.Dial(nil)).ListNodes(ctx, &v1.ListNodesRequest{})
	wantCode(t, err, codes.Unauthenticated)
	_, err = v1.NewAgentServiceClient(cp.Dial(nil)).GetAssignment(ctx, &v1.GetAssignmentRequest{})
	wantCode(t, err, codes.Unauthenticated)
	// The wrong kind of certificate: PermissionDenied, and nothing changes.
	before := snap(t, cp)
	_, err = v1.NewAdminServiceClient(cp.Dial(&node)).CreateNode(ctx, &v1.CreateNodeRequest{Name: "evil", Template: fleet.Template})
	wantCode(t, err, codes.PermissionDenied)
	_, err = v1.NewAgentServiceClient(cp.Dial(&cp.AdminCert)).GetAssignment(ctx, &v1.GetAssignmentRequest{})
	wantCode(t, err, codes.PermissionDenied)
	if after := snap(t, cp); after != before {
		t.Fatalf("refused calls changed the store: %+v -> %+v", before, after)
	}
	if _, err := cp.Admin.GetNode(ctx, &v1.GetNodeRequest{Name: "evil"}); status.Code(err) != codes.NotFound {
		t.Fatalf("a node certificate created a node: %v", err)
	}

	// A revoked certificate is refused on its next call.
	agent := v1.NewAgentServiceClient(cp.Dial(&node))
	if _, err := agent.GetAssignment(ctx, &v1.GetAssignmentRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Admin.RevokeCertificate(ctx, &v1.RevokeCertificateRequest{Serial: node.Leaf.SerialNumber.Text(16), Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	_, err = agent.GetAssignment(ctx, &v1.GetAssignmentRequest{})
	wantCode(t, err, codes.Unauthenticated)

	// An expired certificate is refused with a message that says so.
	_, token2 := cp.Provision(ctx, fleet.Node)
	key2 := testcp.NewNodeKey(t)
	resp2, err := v1.NewEnrollmentServiceClient(cp.Dial(nil)).Enroll(ctx, &v1.EnrollRequest{Token: token2, CsrPem: key2.CSRPEM})
	if err != nil {
		t.Fatal(err)
	}
	node2 := key2.Certificate(t, resp2.CertificatePem)
	clk.Advance(25 * time.Hour)
	_, err = v1.NewAgentServiceClient(cp.Dial(&node2)).GetAssignment(ctx, &v1.GetAssignmentRequest{})
	wantCode(t, err, codes.Unauthenticated)
	if !strings.Contains(status.Convert(err).Message(), "expired") {
		t.Fatalf("the refusal must say the certificate expired: %v", err)
	}
}

// withUnknownField appends field 999 (varint 1) to a message's wire form.
func withUnknownField(m proto.Message) proto.Message {
	raw := protowire.AppendTag(nil, 999, protowire.VarintType)
	raw = protowire.AppendVarint(raw, 1)
	m.ProtoReflect().SetUnknown(raw)
	return m
}

func TestStrictInput(t *testing.T) {
	cp := testcp.Start(t)
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "edge")
	before := snap(t, cp)

	_, err := cp.Admin.CreateNode(ctx, withUnknownField(&v1.CreateNodeRequest{Name: "n2", Template: fleet.Template}).(*v1.CreateNodeRequest))
	wantCode(t, err, codes.InvalidArgument)
	if !strings.Contains(status.Convert(err).Message(), "999") {
		t.Fatalf("the refusal must name the field number: %v", err)
	}
	// Nested unknown fields are found too.
	ref := withUnknownField(&v1.ModuleRef{Name: fleet.Node + "-base", Version: "1"}).(*v1.ModuleRef)
	_, err = cp.Admin.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: "t2", RootModules: []*v1.ModuleRef{ref}})
	wantCode(t, err, codes.InvalidArgument)
	// An enum value the server does not know.
	_, err = cp.Admin.CreateTask(ctx, &v1.CreateTaskRequest{InstanceId: "x", Kind: v1.TaskKind(77)})
	wantCode(t, err, codes.InvalidArgument)
	// Unknown fields on the unauthenticated service as well.
	_, err = v1.NewEnrollmentServiceClient(cp.Dial(nil)).Enroll(ctx, withUnknownField(&v1.EnrollRequest{Token: "x", CsrPem: "y"}).(*v1.EnrollRequest))
	wantCode(t, err, codes.InvalidArgument)
	// An oversize message is refused before it is parsed.
	big := strings.Repeat("x", 5<<20)
	_, err = cp.Admin.CreateNode(ctx, &v1.CreateNodeRequest{Name: "n3", Template: fleet.Template, PublicAddress: big}, grpc.MaxCallSendMsgSize(16<<20))
	wantCode(t, err, codes.ResourceExhausted)
	// Blank required fields and out-of-range numbers name the field.
	for _, call := range []func() error{
		func() error {
			_, err := cp.Admin.CreateNode(ctx, &v1.CreateNodeRequest{Template: fleet.Template})
			return err
		},
		func() error { _, err := cp.Admin.ListNodes(ctx, &v1.ListNodesRequest{PageSize: -1}); return err },
		func() error {
			_, err := cp.Admin.CreateBootstrapToken(ctx, &v1.CreateBootstrapTokenRequest{InstanceId: "x", TtlSeconds: -5})
			return err
		},
		func() error {
			_, err := cp.Admin.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: fleet.Node, UpdateMask: []string{"bogus"}})
			return err
		},
	} {
		wantCode(t, call(), codes.InvalidArgument)
	}
	if after := snap(t, cp); after != before {
		t.Fatalf("refused requests changed the store: %+v -> %+v", before, after)
	}
}

func TestProvisionIsIdempotent(t *testing.T) {
	cp := testcp.Start(t)
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "edge")
	req := &v1.ProvisionInstanceRequest{Node: fleet.Node, Provider: "external", OperationId: "op-42"}
	first, err := cp.Admin.ProvisionInstance(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	second, err := cp.Admin.ProvisionInstance(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if second.Instance.Id != first.Instance.Id || !second.Existing || second.BootstrapToken != "" {
		t.Fatalf("retry: id %s vs %s, existing %v, token shown again %v", second.Instance.Id, first.Instance.Id, second.Existing, second.BootstrapToken != "")
	}
	list, err := cp.Admin.ListInstances(ctx, &v1.ListInstancesRequest{Node: fleet.Node})
	if err != nil || len(list.Instances) != 1 {
		t.Fatalf("instances after a retried provision: %v %v", list, err)
	}
	// Unknown provider and a disabled node are refused with reasons.
	_, err = cp.Admin.ProvisionInstance(ctx, &v1.ProvisionInstanceRequest{Node: fleet.Node, Provider: "nope"})
	wantCode(t, err, codes.InvalidArgument)
	if _, err := cp.Admin.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: fleet.Node, UpdateMask: []string{"enabled"}, Enabled: false}); err != nil {
		t.Fatal(err)
	}
	_, err = cp.Admin.ProvisionInstance(ctx, &v1.ProvisionInstanceRequest{Node: fleet.Node, Provider: "external"})
	wantCode(t, err, codes.FailedPrecondition)
}

func TestCatalogCRUD(t *testing.T) {
	cp := testcp.Start(t)
	ctx := ctxT(t)
	img := testcp.TinyErofs()
	m := cp.PushModule(ctx, "base", "1", img)
	if m.Digest != testcp.Digest(img) || m.Size != int64(len(img)) {
		t.Fatalf("pushed module %+v", m)
	}
	// Same content again: fine, nothing changes. Different content: AlreadyExists.
	if again := cp.PushModule(ctx, "base", "1", img); again.Digest != m.Digest || !again.CreatedAt.AsTime().Equal(m.CreatedAt.AsTime()) {
		t.Fatal("re-pushing the same content changed the module")
	}
	other := testcp.BuildErofs(fstest.MapFS{"x": {Data: []byte("x")}})
	_, err := testcp.PushModule(ctx, cp.Admin, "base", "1", other)
	wantCode(t, err, codes.AlreadyExists)

	_, err = cp.Admin.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: "web", RootModules: []*v1.ModuleRef{{Name: "base", Version: "2"}}})
	wantCode(t, err, codes.InvalidArgument)
	tpl, err := cp.Admin.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: "web", RootModules: []*v1.ModuleRef{{Name: "base", Version: "1"}}})
	if err != nil {
		t.Fatal(err)
	}
	if tpl.RootModules[0].Digest != m.Digest {
		t.Fatal("template must show the resolved digest")
	}
	if tpl.Console != "ttyS0" {
		t.Fatalf("a template's console is serial unless set: %q", tpl.Console)
	}
	for _, tc := range []struct {
		console string
		code    codes.Code
	}{
		{"ttyS1,115200n8", codes.OK},
		{"none", codes.OK},
		{"tty0", codes.OK},
		{"ttyS0 init=/bin/sh", codes.InvalidArgument},
		{"ttyS0\nchain http://evil", codes.InvalidArgument},
		{"/dev/ttyS0", codes.InvalidArgument},
	} {
		got, err := cp.Admin.UpdateTemplate(ctx, &v1.UpdateTemplateRequest{Name: "web", UpdateMask: []string{"console"}, Console: tc.console})
		if tc.code != codes.OK {
			wantCode(t, err, tc.code)
			if !strings.Contains(err.Error(), "console") {
				t.Errorf("refusal of console %q does not name the field: %v", tc.console, err)
			}
			continue
		}
		if err != nil || got.Console != tc.console {
			t.Fatalf("console %q: %v %v", tc.console, got.GetConsole(), err)
		}
	}
	if got, err := cp.Admin.GetTemplate(ctx, &v1.GetTemplateRequest{Name: "web"}); err != nil || got.Console != "tty0" {
		t.Fatalf("a refused console must change nothing: %v %v", got.GetConsole(), err)
	}
	_, err = cp.Admin.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: "web", RootModules: []*v1.ModuleRef{{Name: "base", Version: "1"}}})
	wantCode(t, err, codes.AlreadyExists)
	if _, err := cp.Admin.CreateNode(ctx, &v1.CreateNodeRequest{Name: "n1", Template: "web"}); err != nil {
		t.Fatal(err)
	}
	_, err = cp.Admin.DeleteModule(ctx, &v1.DeleteModuleRequest{Name: "base", Version: "1"})
	wantCode(t, err, codes.FailedPrecondition)
	_, err = cp.Admin.DeleteTemplate(ctx, &v1.DeleteTemplateRequest{Name: "web"})
	wantCode(t, err, codes.FailedPrecondition)
	if _, err := cp.Admin.DeleteNode(ctx, &v1.DeleteNodeRequest{Name: "n1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Admin.DeleteTemplate(ctx, &v1.DeleteTemplateRequest{Name: "web"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Admin.DeleteModule(ctx, &v1.DeleteModuleRequest{Name: "base", Version: "1"}); err != nil {
		t.Fatal(err)
	}
	_, err = cp.Admin.GetModule(ctx, &v1.GetModuleRequest{Name: "base", Version: "1"})
	wantCode(t, err, codes.NotFound)
}

// badSignature flips the last byte of a CSR (inside its signature).
func badSignature(t *testing.T, csrPEM string) string {
	block, _ := pem.Decode([]byte(csrPEM))
	der := append([]byte(nil), block.Bytes...)
	der[len(der)-1] ^= 0xff
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}
