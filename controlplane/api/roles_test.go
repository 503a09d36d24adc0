package api_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/tetherfleet/tether/controlplane/api"
	"github.com/tetherfleet/tether/internal/testkit/logbuf"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// identity mints an admin identity of role through the API, with its key
// made here, as `tetherctl identity create` does.
func identity(t *testing.T, cp *testcp.ControlPlane, name, role string) tls.Certificate {
	t.Helper()
	key := testcp.NewNodeKey(t)
	resp, err := cp.Admin.CreateIdentity(ctxT(t), &v1.CreateIdentityRequest{Name: name, Role: role, CsrPem: key.CSRPEM})
	if err != nil {
		t.Fatalf("create identity %s: %v", name, err)
	}
	if resp.Identity.Role != role || resp.Identity.Serial == "" {
		t.Fatalf("identity = %v", resp.Identity)
	}
	return key.Certificate(t, resp.CertificatePem)
}

// call invokes method with an empty request of its input type, whatever
// its streaming shape, and returns the status code.
func call(ctx context.Context, conn *grpc.ClientConn, svc protoreflect.ServiceDescriptor, m protoreflect.MethodDescriptor) error {
	full := "/" + string(svc.FullName()) + "/" + string(m.Name())
	req := dynamicpb.NewMessage(m.Input())
	resp := dynamicpb.NewMessage(m.Output())
	if !m.IsStreamingClient() && !m.IsStreamingServer() {
		return conn.Invoke(ctx, full, req, resp)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{StreamName: string(m.Name()), ClientStreams: m.IsStreamingClient(), ServerStreams: m.IsStreamingServer()}, full)
	if err != nil {
		return err
	}
	if !m.IsStreamingClient() {
		if err := st.SendMsg(req); err != nil {
			return st.RecvMsg(resp)
		}
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	return st.RecvMsg(resp)
}

// Every RPC of every service, with a viewer, an operator, an admin and a
// node certificate: the role table decides, PermissionDenied names the
// role required, a node never reaches an admin RPC and an admin never
// passes for a node. New RPCs are picked up from the descriptors.
func TestRoleMatrix(t *testing.T) {
	cp := testcp.Start(t)
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "edge")
	_, token := cp.Provision(ctx, fleet.Node)
	key := testcp.NewNodeKey(t)
	enr, err := v1.NewEnrollmentServiceClient(cp.Dial(nil)).Enroll(ctx, &v1.EnrollRequest{Token: token, CsrPem: key.CSRPEM})
	if err != nil {
		t.Fatal(err)
	}
	node := key.Certificate(t, enr.CertificatePem)
	certs := map[string]tls.Certificate{"viewer": identity(t, cp, "vera", "viewer"), "operator": identity(t, cp, "otto", "operator"), "admin": cp.AdminCert, "node": node}
	rank := map[string]int{"viewer": 1, "operator": 2, "admin": 3}
	roleOf := map[string]string{}
	admin := v1.File_tether_v1_admin_proto.Services().ByName("AdminService")
	agentSvc := v1.File_tether_v1_agent_proto.Services().ByName("AgentService")
	conns := map[string]*grpc.ClientConn{}
	for who, c := range certs {
		conns[who] = cp.Dial(&c)
	}
	methods := admin.Methods()
	if methods.Len() < 50 {
		t.Fatalf("only %d admin methods found", methods.Len())
	}
	for i := 0; i < methods.Len(); i++ {
		m := methods.Get(i)
		t.Run(string(m.Name()), func(t *testing.T) {
			need, ok := api.RoleFor(string(m.Name()))
			if !ok {
				t.Fatalf("%s is missing from the role table", m.Name())
			}
			roleOf[string(m.Name())] = need
			for _, who := range []string{"viewer", "operator", "admin"} {
				err := call(ctx, conns[who], admin, m)
				code := status.Code(err)
				if rank[who] >= rank[need] {
					if code == codes.PermissionDenied || code == codes.Unauthenticated || code == codes.Unimplemented || code == codes.Unknown {
						t.Errorf("%s (role %s needed) as %s: %v", m.Name(), need, who, err)
					}
				} else if code != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), "needs role "+need) {
					t.Errorf("%s (role %s needed) as %s: %v, want PermissionDenied naming %s", m.Name(), need, who, err, need)
				}
			}
			if err := call(ctx, conns["node"], admin, m); status.Code(err) != codes.PermissionDenied {
				t.Errorf("%s with a node certificate: %v, want PermissionDenied", m.Name(), err)
			}
		})
	}
	// The table's shape: reads for viewers, the fleet for operators,
	// identity material for admins.
	for name, want := range map[string]string{"ListInstances": "viewer", "TerminateInstance": "operator", "AcquirePoolMember": "operator",
		"CreateBootstrapToken": "admin", "RevokeCertificate": "admin", "ListCertificates": "admin", "PushModule": "admin", "AddSigner": "admin",
		"CreateIdentity": "admin", "ListIdentities": "admin", "RevokeIdentity": "admin", "ListAudit": "admin", "RenewIdentity": "viewer"} {
		if roleOf[name] != want {
			t.Errorf("%s needs %q, want %q", name, roleOf[name], want)
		}
	}
	agentMethods := agentSvc.Methods()
	for i := 0; i < agentMethods.Len(); i++ {
		m := agentMethods.Get(i)
		for _, who := range []string{"viewer", "operator", "admin"} {
			if err := call(ctx, conns[who], agentSvc, m); status.Code(err) != codes.PermissionDenied {
				t.Errorf("agent %s as %s: %v, want PermissionDenied", m.Name(), who, err)
			}
		}
	}
}

func TestIdentitiesRevokeAndRenew(t *testing.T) {
	cp := testcp.Start(t)
	ctx := ctxT(t)
	op := identity(t, cp, "otto", "operator")
	opAdmin := v1.NewAdminServiceClient(cp.Dial(&op))
	if _, err := opAdmin.ListNodes(ctx, &v1.ListNodesRequest{}); err != nil {
		t.Fatal(err)
	}
	// Only an admin mints identities; a name is taken once.
	_, err := opAdmin.CreateIdentity(ctx, &v1.CreateIdentityRequest{Name: "x", Role: "admin", CsrPem: testcp.NewNodeKey(t).CSRPEM})
	wantMsg(t, err, codes.PermissionDenied, "needs role admin")
	_, err = cp.Admin.CreateIdentity(ctx, &v1.CreateIdentityRequest{Name: "otto", Role: "viewer", CsrPem: testcp.NewNodeKey(t).CSRPEM})
	wantCode(t, err, codes.AlreadyExists)
	_, err = cp.Admin.CreateIdentity(ctx, &v1.CreateIdentityRequest{Name: "y", Role: "root", CsrPem: testcp.NewNodeKey(t).CSRPEM})
	wantMsg(t, err, codes.InvalidArgument, "role")

	// Renewal keeps the name and role; the default lifetime is 90 days.
	key := testcp.NewNodeKey(t)
	ren, err := opAdmin.RenewIdentity(ctx, &v1.RenewIdentityRequest{CsrPem: key.CSRPEM})
	if err != nil {
		t.Fatal(err)
	}
	renewed := key.Certificate(t, ren.CertificatePem)
	if ren.Identity.Name != "otto" || ren.Identity.Role != "operator" {
		t.Fatalf("renewed identity = %v", ren.Identity)
	}
	if life := renewed.Leaf.NotAfter.Sub(renewed.Leaf.NotBefore); life < 89*24*time.Hour || life > 91*24*time.Hour {
		t.Fatalf("lifetime %s, want 90 days", life)
	}
	list, err := cp.Admin.ListIdentities(ctx, &v1.ListIdentitiesRequest{})
	// The init admin is listed first, then otto.
	if err != nil || len(list.Identities) != 2 || list.Identities[1].Serial != ren.Identity.Serial {
		t.Fatalf("identities = %v %v", list, err)
	}

	// A revoked identity is refused on its next call.
	renewedAdmin := v1.NewAdminServiceClient(cp.Dial(&renewed))
	if _, err := renewedAdmin.ListNodes(ctx, &v1.ListNodesRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Admin.RevokeIdentity(ctx, &v1.RevokeIdentityRequest{Name: "otto"}); err != nil {
		t.Fatal(err)
	}
	_, err = renewedAdmin.ListNodes(ctx, &v1.ListNodesRequest{})
	wantMsg(t, err, codes.Unauthenticated, "revoked")
}

type syncBuf = logbuf.Buffer

func TestAuditTrail(t *testing.T) {
	logs := &syncBuf{}
	cp := testcp.Start(t, testcp.WithLog(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "edge")
	in, token := cp.Provision(ctx, fleet.Node)
	tok2, err := cp.Admin.CreateBootstrapToken(ctx, &v1.CreateBootstrapTokenRequest{InstanceId: in.Id})
	if err != nil {
		t.Fatal(err)
	}
	op := identity(t, cp, "otto", "operator")
	opAdmin := v1.NewAdminServiceClient(cp.Dial(&op))

	if _, err := opAdmin.TerminateInstance(ctx, &v1.InstanceActionRequest{Id: in.Id}); err != nil {
		t.Fatal(err)
	}
	_, err = opAdmin.CreateBootstrapToken(ctx, &v1.CreateBootstrapTokenRequest{InstanceId: in.Id})
	wantCode(t, err, codes.PermissionDenied)
	_, err = opAdmin.TerminateInstance(ctx, &v1.InstanceActionRequest{Id: "no-such-instance"})
	wantCode(t, err, codes.NotFound)
	// Reads of the fleet are not audited; reads of the trail are.
	if _, err := opAdmin.ListInstances(ctx, &v1.ListInstancesRequest{}); err != nil {
		t.Fatal(err)
	}

	recs, err := cp.Admin.ListAudit(ctx, &v1.ListAuditRequest{Identity: "otto"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range recs.Records {
		if r.Role != "operator" || r.Serial != op.Leaf.SerialNumber.Text(16) || r.At == nil {
			t.Errorf("record %v does not name otto's role and serial", r)
		}
		got = append(got, r.Method+" "+r.Target+" "+r.Code)
	}
	want := []string{"TerminateInstance id=" + in.Id + " OK", "CreateBootstrapToken instance_id=" + in.Id + " PermissionDenied", "TerminateInstance id=no-such-instance NotFound"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("otto's audit records:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	all, err := cp.Admin.ListAudit(ctx, &v1.ListAuditRequest{Identity: "admin"})
	if err != nil {
		t.Fatal(err)
	}
	methods := map[string]int{}
	for _, r := range all.Records {
		methods[r.Method]++
	}
	if methods["ListAudit"] != 1 || methods["CreateIdentity"] != 1 || methods["CreateBootstrapToken"] != 1 || methods["PushModule"] != 1 {
		t.Fatalf("admin's records by method: %v", methods)
	}

	// No token, key or CSR anywhere: the store file, the logs, the events.
	evs, err := cp.Admin.ListEvents(ctx, &v1.ListEventsRequest{PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	evJSON, _ := json.Marshal(evs)
	var stored []byte
	files, _ := filepath.Glob(filepath.Join(cp.DataDir, "tether.db*"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		stored = append(stored, b...)
	}
	if len(stored) == 0 {
		t.Fatal("no store file found to search")
	}
	for what, hay := range map[string]string{"store": string(stored), "logs": logs.String(), "events": string(evJSON)} {
		for _, needle := range []string{token, tok2.Token, "PRIVATE KEY", "CERTIFICATE REQUEST"} {
			if needle != "" && strings.Contains(hay, needle) {
				t.Errorf("%s contains %q", what, needle[:min(len(needle), 12)])
			}
		}
	}
}
