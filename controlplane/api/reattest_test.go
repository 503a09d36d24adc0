package api_test

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentenroll "github.com/tetherfleet/tether/agent/enroll"
	"github.com/tetherfleet/tether/agent/tpm"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/testkit/logbuf"
	"github.com/tetherfleet/tether/internal/testkit/swtpmtest"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	"github.com/tetherfleet/tether/pki/attestation"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// swMachine is a machine's TPM as the agent opens it, on a swtpm: each
// open is a fresh command channel, closed by the agent after use.
type swMachine struct {
	sw   *swtpmtest.TPM
	hash string
}

func newSWMachine(t *testing.T) *swMachine {
	t.Helper()
	sw := swtpmtest.Start(t)
	m := &swMachine{sw: sw}
	a, err := m.open()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	pub, _, err := a.Endorsement()
	if err != nil {
		t.Fatal(err)
	}
	if m.hash, err = attestation.EKHashDER(pub); err != nil {
		t.Fatal(err)
	}
	return m
}

func (m *swMachine) open() (agentenroll.AttesterCloser, error) {
	c, err := net.Dial("unix", filepath.Join(m.sw.Dir, "tpm.sock"))
	if err != nil {
		return nil, err
	}
	tp, err := tpm.OpenChannel(c, nil)
	if err != nil {
		c.Close()
		return nil, err
	}
	return swAttester{tp}, nil
}

type swAttester struct{ t *tpm.TPM }

func (a swAttester) Endorsement() ([]byte, []byte, error) {
	ek, err := a.t.EK()
	return ek.PublicDER, ek.CertificateDER, err
}

func (a swAttester) NewKey() (agentenroll.AttestationKey, error) {
	ak, err := a.t.NewAK()
	if err != nil {
		return nil, err
	}
	return ak, nil
}

func (a swAttester) Close() error { return a.t.Close() }

// TestReattestAfterPartition: a node whose EK is bound enrolls with no
// token; the control plane is out of reach past its certificate's
// lifetime, so the certificate expires and is refused; the agent's
// recovery, with no token anywhere, enrolls the same instance again by
// its TPM, and the new certificate works. With the EK unbound meanwhile,
// recovery is refused with the reason and the command, and keeps trying.
func TestReattestAfterPartition(t *testing.T) {
	m := newSWMachine(t)
	bothStores(t, func(t *testing.T, st testcpStore) {
		clk := clock.NewFake(time.Now())
		cp := testcp.Start(t, testcp.WithClock(clk), testcp.WithStore(st.dsn))
		ctx := ctxT(t)
		fleet := cp.SeedFleet(ctx, "edge")
		if _, err := cp.Admin.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: fleet.Node, UpdateMask: []string{"ek_hashes", "require_attestation"},
			EkHashes: []string{m.hash}, RequireAttestation: true}); err != nil {
			t.Fatal(err)
		}
		inst, token := cp.Provision(ctx, fleet.Node)
		if token != "" {
			t.Fatalf("a node with a bound EK was given a token")
		}
		console := &logbuf.Buffer{}
		mgr, err := agentenroll.New(agentenroll.Config{StateDir: t.TempDir(), URL: "https://" + cp.Addr, CAFingerprint: cp.Fingerprint(),
			Clock: clk, Logf: func(f string, args ...any) { fmt.Fprintf(console, f+"\n", args...) }})
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
		first, err := mgr.EnrollAttested(ctx, v1.NewEnrollmentServiceClient(conn), inst.Id, tp)
		tp.Close()
		if err != nil {
			t.Fatal(err)
		}
		agentConn, err := mgr.Dial(true)
		if err != nil {
			t.Fatal(err)
		}
		defer agentConn.Close()
		agent := v1.NewAgentServiceClient(agentConn)
		clientFn := func() v1.AgentServiceClient { return agent }

		// The partition outlasts the certificate.
		clk.Advance(25 * time.Hour)
		if _, err := v1.NewAgentServiceClient(cp.Dial(first.TLS)).GetAssignment(ctx, &v1.GetAssignmentRequest{}); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("the expired certificate: %v, want Unauthenticated", err)
		}

		// Unbound meanwhile: refused with the reason, retried.
		if _, err := cp.Admin.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: fleet.Node, UpdateMask: []string{"ek_hashes"}}); err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		go clk.AutoAdvance(rctx)
		done := make(chan error, 1)
		go func() { done <- mgr.Recover(rctx, clientFn, agentenroll.Recovery{OpenTPM: m.open}) }()
		line := awaitLine(t, console, "retrying in")
		for _, want := range []string{"re-enrolling by TPM attestation failed", "node edge has no EK bound", "tetherctl node update edge --ek " + m.hash} {
			if !strings.Contains(line, want) {
				t.Errorf("recovery line %q lacks %q", line, want)
			}
		}
		cancel()
		<-done
		if !mgr.Current().Expired(clk.Now()) {
			t.Fatal("a refused re-attestation replaced the certificate")
		}

		// Bound again: recovery needs no token.
		if _, err := cp.Admin.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: fleet.Node, UpdateMask: []string{"ek_hashes"}, EkHashes: []string{m.hash}}); err != nil {
			t.Fatal(err)
		}
		if err := mgr.Recover(ctx, clientFn, agentenroll.Recovery{OpenTPM: m.open}); err != nil {
			t.Fatal(err)
		}
		cur := mgr.Current()
		if cur.Expired(clk.Now()) || cur.InstanceID != inst.Id || cur.Cert.SerialNumber.Cmp(first.Cert.SerialNumber) == 0 {
			t.Fatalf("after recovery: instance %s, serial %v (first %v), expired %v", cur.InstanceID, cur.Cert.SerialNumber, first.Cert.SerialNumber, cur.Expired(clk.Now()))
		}
		awaitLine(t, console, "re-enrolled as instance "+inst.Id+" by TPM attestation")
		if _, err := v1.NewAgentServiceClient(cp.Dial(cur.TLS)).GetAssignment(ctx, &v1.GetAssignmentRequest{}); err != nil {
			t.Fatalf("the re-attested certificate is refused: %v", err)
		}
		evs, err := cp.Admin.ListEvents(ctx, &v1.ListEventsRequest{Kind: "enroll.succeeded", InstanceId: inst.Id})
		if err != nil {
			t.Fatal(err)
		}
		if len(evs.Events) != 2 {
			t.Fatalf("%d enroll.succeeded events, want 2 (boot and recovery)", len(evs.Events))
		}
		for _, e := range evs.Events {
			if !strings.Contains(e.Message, "TPM attestation (EK "+m.hash+")") {
				t.Errorf("enrollment %q was not by attestation", e.Message)
			}
		}
	})
}

// awaitLine is the first line of buf that contains want, once there is one.
func awaitLine(t *testing.T, buf *logbuf.Buffer, want string) string {
	t.Helper()
	if !buf.Await(20*time.Second, func(s string) bool { return strings.Contains(s, want) }) {
		t.Fatalf("no line containing %q in:\n%s", want, buf.String())
	}
	for _, l := range strings.Split(buf.String(), "\n") {
		if strings.Contains(l, want) {
			return l
		}
	}
	return ""
}
