package api_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/tetherfleet/tether/agent/announce"
	agentenroll "github.com/tetherfleet/tether/agent/enroll"
	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/logbuf"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	"github.com/tetherfleet/tether/pki/attestation"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// announceCP is a control plane that boots unknown machines to announce
// themselves, and the base URL of its netboot port.
func announceCP(t *testing.T, st testcpStore) (*testcp.ControlPlane, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cp := testcp.Start(t, testcp.WithStore(st.dsn), testcp.With(func(o *daemon.ServeOptions) {
		o.Test.NetbootListener, o.Listeners.NetbootAnnounce = lis, true
	}))
	return cp, "http://" + lis.Addr().String()
}

// announceEK posts an announcement of mac with ek as a machine would.
func announceEK(t *testing.T, base, mac string, ek []byte) *v1.NetbootAnnounceReply {
	t.Helper()
	b, err := proto.Marshal(&v1.NetbootAnnounce{Mac: mac, EkPublic: ek})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(base+"/netboot/announce", "application/x-protobuf", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("announce %s: %s %s", mac, resp.Status, body)
	}
	var r v1.NetbootAnnounceReply
	if err := proto.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	return &r
}

// newEK is an ECDSA P-256 key in the EK's PKIX form, and its hash.
func newEK(t *testing.T) ([]byte, string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	h, err := attestation.EKHashDER(der)
	if err != nil {
		t.Fatal(err)
	}
	return der, h
}

// nodesState is what "the refusal changed nothing" compares.
func nodesState(t *testing.T, cp *testcp.ControlPlane) string {
	t.Helper()
	ns, err := cp.Admin.ListNodes(ctxT(t), &v1.ListNodesRequest{PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, n := range ns.Nodes {
		fmt.Fprintf(&b, "%s %s %v %v %v\n", n.Name, n.TemplateName, n.Macs, n.EkHashes, n.UpdatedAt.AsTime())
	}
	return b.String()
}

func eventsOf(t *testing.T, cp *testcp.ControlPlane, kind string) []*v1.FleetEvent {
	t.Helper()
	evs, err := cp.Admin.ListEvents(ctxT(t), &v1.ListEventsRequest{Kind: kind, PageSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	return evs.Events
}

// TestAdoptNode: an admin adopts a machine by the MAC and EK it announced,
// in one audited call that creates the node (or adds them to the node
// that has the MAC); every refusal names what is wrong and changes
// nothing, and an EK bound elsewhere raises the high-severity conflict.
func TestAdoptNode(t *testing.T) {
	bothStores(t, func(t *testing.T, st testcpStore) {
		cp, base := announceCP(t, st)
		ctx := ctxT(t)
		fleet := cp.SeedFleet(ctx, "edge")
		const mac1, mac2, mac3, mac4, mac5 = "52:54:00:ad:01:01", "52:54:00:ad:01:02", "52:54:00:ad:01:03", "52:54:00:ad:01:04", "52:54:00:ad:01:05"
		ekA, hashA := newEK(t)
		ekB, hashB := newEK(t)
		ekC, hashC := newEK(t)
		ekD, _ := newEK(t)
		if r := announceEK(t, base, mac1, ekA); r.State != v1.NetbootAnnounceReply_STATE_ANNOUNCED || r.EkHash != hashA {
			t.Fatalf("announce reply %v", r)
		}

		// The happy path: no --ek, the one announced is bound.
		res, err := cp.Admin.AdoptNode(ctx, &v1.AdoptNodeRequest{Mac: "52-54-00-AD-01-01", Template: fleet.Template})
		if err != nil {
			t.Fatal(err)
		}
		if !res.Created || !res.Announced || res.Node.Name != "m-525400ad0101" || strings.Join(res.Node.Macs, ",") != mac1 ||
			strings.Join(res.Node.EkHashes, ",") != hashA || res.Node.TemplateName != fleet.Template {
			t.Fatalf("adopted %v", res)
		}
		adopted := eventsOf(t, cp, "node.adopted")
		if len(adopted) != 1 || !strings.Contains(adopted[0].Message, hashA) || !strings.Contains(adopted[0].Message, mac1) {
			t.Fatalf("node.adopted events %v", adopted)
		}
		audit, err := cp.Admin.ListAudit(ctx, &v1.ListAuditRequest{PageSize: 1000})
		if err != nil {
			t.Fatal(err)
		}
		var rec *v1.AuditRecord
		for _, r := range audit.Records {
			if r.Method == "AdoptNode" {
				rec = r
			}
		}
		if rec == nil || rec.Code != "OK" || !strings.Contains(rec.Target, "mac=52-54-00-AD-01-01") {
			t.Fatalf("audit record of the adoption: %v", rec)
		}
		// Adopting it again changes nothing and is no error.
		if again, err := cp.Admin.AdoptNode(ctx, &v1.AdoptNodeRequest{Mac: mac1, EkHash: hashA}); err != nil || again.Created ||
			strings.Join(again.Node.EkHashes, ",") != hashA {
			t.Fatalf("adopting again: %v, %v", again, err)
		}
		// Once adopted, the machine's next announcement is told to wait.
		if r := announceEK(t, base, mac1, ekA); r.State != v1.NetbootAnnounceReply_STATE_ADOPTED || r.Node != "m-525400ad0101" {
			t.Fatalf("announce after adoption: %v", r)
		}

		announceEK(t, base, mac3, ekB) // two senders claim mac3
		announceEK(t, base, mac3, ekC)
		announceEK(t, base, mac4, ekA) // A is m-525400ad0101's
		announceEK(t, base, mac5, ekD)
		otto := identity(t, cp, "otto", "operator")
		op := v1.NewAdminServiceClient(cp.Dial(&otto))
		conflicts := len(eventsOf(t, cp, "node.ek_conflict"))
		refusals := []struct {
			name   string
			client v1.AdminServiceClient
			req    *v1.AdoptNodeRequest
			code   codes.Code
			say    []string
		}{
			{"not a MAC", nil, &v1.AdoptNodeRequest{Mac: "52:54:00", Template: fleet.Template}, codes.InvalidArgument, []string{"mac"}},
			{"not an EK hash", nil, &v1.AdoptNodeRequest{Mac: mac2, EkHash: "sha256:abc", Template: fleet.Template}, codes.InvalidArgument, []string{"ek_hash"}},
			{"unseen without an EK", nil, &v1.AdoptNodeRequest{Mac: mac2, Unseen: true, Template: fleet.Template}, codes.InvalidArgument, []string{"unseen", "needs ek_hash"}},
			{"a bad name", nil, &v1.AdoptNodeRequest{Mac: mac2, Name: "a b", Template: fleet.Template}, codes.InvalidArgument, []string{"name"}},
			{"nothing announced", nil, &v1.AdoptNodeRequest{Mac: mac2, Template: fleet.Template}, codes.FailedPrecondition,
				[]string{"no TPM endorsement key was announced for " + mac2, "--unseen"}},
			{"an EK not announced for the MAC", nil, &v1.AdoptNodeRequest{Mac: mac5, EkHash: hashB, Template: fleet.Template}, codes.FailedPrecondition,
				[]string{"endorsement key " + hashB + " was not announced for " + mac5, "--unseen"}},
			{"several announced", nil, &v1.AdoptNodeRequest{Mac: mac3, Template: fleet.Template}, codes.FailedPrecondition,
				[]string{"2 endorsement keys were announced for " + mac3, hashB, hashC, "console"}},
			{"the EK is bound to another node", nil, &v1.AdoptNodeRequest{Mac: mac4, Template: fleet.Template}, codes.AlreadyExists,
				[]string{hashA, "m-525400ad0101"}},
			{"the MAC belongs to another node", nil, &v1.AdoptNodeRequest{Mac: mac1, Name: fleet.Node, EkHash: hashA}, codes.AlreadyExists,
				[]string{mac1, `belongs to node "m-525400ad0101"`}},
			{"no template to create with", nil, &v1.AdoptNodeRequest{Mac: mac5}, codes.InvalidArgument, []string{"template", "required to create node"}},
			{"an unknown template", nil, &v1.AdoptNodeRequest{Mac: mac5, Template: "nope"}, codes.InvalidArgument, []string{`template "nope" does not exist`}},
			{"another template than the node's", nil, &v1.AdoptNodeRequest{Mac: mac1, Template: "nope"}, codes.FailedPrecondition,
				[]string{`has template "` + fleet.Template + `"`}},
			{"an operator", op, &v1.AdoptNodeRequest{Mac: mac5, Template: fleet.Template}, codes.PermissionDenied, []string{"needs role admin", "otto"}},
		}
		for _, r := range refusals {
			t.Run(r.name, func(t *testing.T) {
				before := nodesState(t, cp)
				c := r.client
				if c == nil {
					c = cp.Admin
				}
				_, err := c.AdoptNode(ctx, r.req)
				wantMsg(t, err, r.code, r.say...)
				if after := nodesState(t, cp); after != before {
					t.Fatalf("a refused adoption changed the nodes:\n%s->\n%s", before, after)
				}
			})
		}
		if evs := eventsOf(t, cp, "node.ek_conflict"); len(evs) != conflicts+1 || evs[0].Severity != v1.Severity_SEVERITY_HIGH || !strings.Contains(evs[0].Message, hashA) {
			t.Fatalf("node.ek_conflict events after the refusals: %v, want one more, high, naming %s", evs, hashA)
		}
		if n := len(eventsOf(t, cp, "node.adopted")); n != 1 {
			t.Fatalf("%d node.adopted events after refusals, want 1", n)
		}

		// --unseen binds a hash read elsewhere; an existing node named by
		// --name gets the MAC and the EK added.
		res, err = cp.Admin.AdoptNode(ctx, &v1.AdoptNodeRequest{Mac: mac2, Name: fleet.Node, EkHash: hashB, Unseen: true})
		if err != nil {
			t.Fatal(err)
		}
		if res.Created || res.Announced || res.Node.Name != fleet.Node || strings.Join(res.Node.Macs, ",") != mac2 || strings.Join(res.Node.EkHashes, ",") != hashB {
			t.Fatalf("adopting into %s: %v", fleet.Node, res)
		}
		// The node that has the MAC is found without --name.
		if _, err := cp.Admin.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: fleet.Node, UpdateMask: []string{"macs"}, Macs: []string{mac2, mac5}}); err != nil {
			t.Fatal(err)
		}
		res, err = cp.Admin.AdoptNode(ctx, &v1.AdoptNodeRequest{Mac: mac5})
		if err != nil {
			t.Fatal(err)
		}
		if res.Created || res.Node.Name != fleet.Node || len(res.Node.EkHashes) != 2 {
			t.Fatalf("adopting a MAC a node has: %v", res)
		}
	})
}

// TestAdoptedMachineEnrollsWithoutToken is adoption end to end with a
// real TPM (swtpm) and the agent's announce mode: the unknown machine
// announces its EK, an admin adopts it without typing the hash, a boot of
// its node makes the agent reboot, and the machine enrolls by its TPM
// with no token.
func TestAdoptedMachineEnrollsWithoutToken(t *testing.T) {
	m := newSWMachine(t)
	bothStores(t, func(t *testing.T, st testcpStore) {
		cp, base := announceCP(t, st)
		ctx := ctxT(t)
		fleet := cp.SeedFleet(ctx, "edge")
		const mac = "52:54:00:ad:02:01"
		console := &logbuf.Buffer{}
		logf := func(f string, args ...any) { fmt.Fprintf(console, f+"\n", args...) }
		actx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		rebooted := make(chan struct{})
		go func() {
			done <- announce.Run(actx, announce.Config{URL: base + "/netboot/announce", MAC: mac, OpenTPM: m.open, Logf: logf,
				Every: 50 * time.Millisecond, Reboot: func() error { close(rebooted); return nil }})
		}()
		awaitLine(t, console, "tetherctl node adopt "+mac+" --ek "+m.hash)
		awaitLine(t, console, "announced: an admin adopts this machine")

		evs := eventsOf(t, cp, "netboot.announced")
		if len(evs) != 1 || !strings.Contains(evs[0].Message, m.hash) || evs[0].Payload.AsMap()["ek_certificate"] != true {
			t.Fatalf("netboot.announced events %v, want one with %s and its EK certificate", evs, m.hash)
		}
		res, err := cp.Admin.AdoptNode(ctx, &v1.AdoptNodeRequest{Mac: mac, Template: fleet.Template, Name: "rack1-07"})
		if err != nil {
			t.Fatal(err)
		}
		if !res.Announced || strings.Join(res.Node.EkHashes, ",") != m.hash {
			t.Fatalf("adopted %v", res)
		}
		awaitLine(t, console, "adopted as node rack1-07")
		inst, token := cp.Provision(ctx, "rack1-07")
		if token != "" {
			t.Fatal("the adopted node's instance got a token")
		}
		select {
		case <-rebooted:
		case <-ctx.Done():
			t.Fatalf("the announcing agent did not reboot into the boot:\n%s", console.String())
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		stop()

		mgr, err := agentenroll.New(agentenroll.Config{StateDir: t.TempDir(), URL: "https://" + cp.Addr, CAFingerprint: cp.Fingerprint()})
		if err != nil {
			t.Fatal(err)
		}
		conn, err := mgr.Dial(false)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		tp, err := m.open()
		if err != nil {
			t.Fatal(err)
		}
		defer tp.Close()
		id, err := mgr.EnrollAttested(ctx, v1.NewEnrollmentServiceClient(conn), inst.Id, tp)
		if err != nil {
			t.Fatalf("the adopted machine's attested enrollment: %v", err)
		}
		if id.InstanceID != inst.Id {
			t.Fatalf("enrolled as %s, want %s", id.InstanceID, inst.Id)
		}
		// Another TPM announcing the same MAC changes no binding.
		other, _ := newEK(t)
		if r := announceEK(t, base, mac, other); r.State == v1.NetbootAnnounceReply_STATE_ANNOUNCED {
			t.Fatalf("an announcement for an adopted MAC was recorded: %v", r)
		}
		n, err := cp.Admin.GetNode(ctx, &v1.GetNodeRequest{Name: "rack1-07"})
		if err != nil || strings.Join(n.EkHashes, ",") != m.hash {
			t.Fatalf("node after another announcement: %v, %v", n, err)
		}
	})
}
