package e2e

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/agent/enroll"
	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	"github.com/tetherfleet/tether/pki"
	"github.com/tetherfleet/tether/pki/ca"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// rotAgent is a simulated agent for the rotation test: the real agent's
// identity manager (pin, enrollment, renewal, trust bundles) and one
// Connect stream, without the rest of the agent.
type rotAgent struct {
	i      int
	mgr    *enroll.Manager
	conn   *grpc.ClientConn
	stream v1.AgentService_ConnectClient
	// closing marks a stream the test ends itself (one per stream).
	closing *atomic.Bool
}

type bundleSeen struct {
	i      int
	active string
	roots  int
}

type rotFleet struct {
	t       *testing.T
	cp      *testcp.ControlPlane
	clk     *clock.Fake
	dir     string
	bundles chan bundleSeen
	drops   chan error
	mu      sync.Mutex
	console []string
}

func (f *rotFleet) logf(format string, args ...any) {
	f.mu.Lock()
	f.console = append(f.console, fmt.Sprintf(format, args...))
	f.mu.Unlock()
}

// newAgent enrolls one agent pinned to pin with token.
func (f *rotFleet) newAgent(ctx context.Context, i int, pin, token string) (*rotAgent, error) {
	mgr, err := enroll.New(enroll.Config{StateDir: filepath.Join(f.dir, fmt.Sprint(i)), URL: "https://" + f.cp.Addr,
		CAFingerprint: pin, Clock: f.clk, Logf: f.logf})
	if err != nil {
		return nil, err
	}
	conn, err := mgr.Dial(false)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if _, err := mgr.Enroll(ctx, v1.NewEnrollmentServiceClient(conn), token); err != nil {
		return nil, err
	}
	return &rotAgent{i: i, mgr: mgr}, nil
}

// connect opens the agent's stream on a new connection with its current
// certificate (tetherd sends the bundle at a stream's start while more
// than one root stands, and on every change), and relays what arrives: bundles to the manager (as the
// agent does) and to f.bundles, an unexpected end to f.drops.
func (f *rotFleet) connect(ctx context.Context, a *rotAgent) error {
	conn, err := a.mgr.Dial(true)
	if err != nil {
		return err
	}
	s, err := v1.NewAgentServiceClient(conn).Connect(ctx)
	if err != nil {
		conn.Close()
		return err
	}
	if err := s.Send(&v1.AgentMessage{Msg: &v1.AgentMessage_Heartbeat{Heartbeat: &v1.Heartbeat{
		Phase: v1.AgentPhase_AGENT_PHASE_READY, AgentVersion: "rotation", BootId: "b"}}}); err != nil {
		conn.Close()
		return err
	}
	closing := new(atomic.Bool)
	a.conn, a.stream, a.closing = conn, s, closing
	go func() {
		for {
			m, err := s.Recv()
			if err != nil {
				if !closing.Load() {
					f.drops <- fmt.Errorf("agent %d: %w", a.i, err)
				}
				return
			}
			if b := m.GetTrustBundle(); b != nil {
				a.mgr.ApplyBundle(b)
				f.bundles <- bundleSeen{i: a.i, active: b.ActiveFingerprint, roots: len(b.Roots)}
			}
		}
	}()
	return nil
}

// await reads bundles until every agent in want has reported one that
// ok accepts; a drop fails the test.
func (f *rotFleet) await(ctx context.Context, want map[int]bool, ok func(bundleSeen) bool, what string) {
	f.t.Helper()
	defer func(start time.Time) { f.t.Logf("%s: %s", what, time.Since(start).Round(time.Millisecond)) }(time.Now())
	left := len(want)
	done := map[int]bool{}
	for left > 0 {
		select {
		case b := <-f.bundles:
			if want[b.i] && !done[b.i] && ok(b) {
				done[b.i] = true
				left--
			}
		case err := <-f.drops:
			f.t.Fatalf("%s: a stream dropped: %v", what, err)
		case <-ctx.Done():
			f.t.Fatalf("%s: %d of %d agents never got the bundle", what, left, len(want))
		}
	}
}

// parallel runs fn for 0..n-1 on 16 workers and returns the first error.
func parallel(n int, fn func(i int) error) error {
	var next atomic.Int64
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					select {
					case errs <- err:
					default:
					}
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

func issuerOf(cert *x509.Certificate) string { return fmt.Sprintf("%x", cert.AuthorityKeyId) }

// TestCARotationThousandAgents: 1,000 agents stay connected through a
// whole rotation (prepare, activate, retire). Each learns the new root
// over its stream and trusts it because it chains to its pin; all renew
// under the new CA; boots during the overlap enroll pinned to either
// fingerprint; a revocation ends a stream of either CA; retire is refused
// while the old CA's certificates live and goes through once they have
// expired, and no stream dropped on the way.
func TestCARotationThousandAgents(t *testing.T) {
	n := 1000
	if testing.Short() {
		n = 100
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	t0 := time.Now()
	clk := clock.NewFake(t0)
	long := 1000 * time.Hour
	cp := testcp.Start(t, testcp.WithClock(clk), testcp.With(func(o *daemon.ServeOptions) {
		// Time moves by hand here: nothing periodic should wake on the way.
		o.Loops.Every, o.Liveness.HeartbeatFlush, o.Liveness.AgentSweep, o.Loops.ProviderSyncEvery, o.Loops.PoolReaperEvery = long, long, long, long, long
		o.Liveness.SilentAfter, o.Liveness.PresumedDeadAfter, o.Liveness.BootTimeout, o.Liveness.SwitchTimeout, o.Liveness.PresenceLease = long, 2*long, long, long, long
		o.Loops.WorkerPoll, o.Loops.WorkerLease = long, long
	}))
	f := &rotFleet{t: t, cp: cp, clk: clk, dir: t.TempDir(), bundles: make(chan bundleSeen, 8*n), drops: make(chan error, n)}
	fleet := cp.SeedFleet(ctx, "rot")
	first := cp.Fingerprint()

	agents := make([]*rotAgent, n)
	start := time.Now()
	if err := parallel(n, func(i int) error {
		_, token := cp.Provision(ctx, fleet.Node)
		a, err := f.newAgent(ctx, i, first, token)
		if err != nil {
			return fmt.Errorf("agent %d: %w", i, err)
		}
		agents[i] = a
		return f.connect(ctx, a)
	}); err != nil {
		t.Fatal(err)
	}
	all := map[int]bool{}
	for i := range n {
		all[i] = true
	}
	t.Logf("%d agents enrolled and connected in %s", n, time.Since(start).Round(time.Millisecond))

	// Prepare: every agent trusts the new root, signed by nothing yet.
	prepared, err := cp.Admin.PrepareCA(ctx, &v1.PrepareCARequest{})
	if err != nil {
		t.Fatal(err)
	}
	second := prepared.Fingerprint
	if _, err := cp.Admin.PrepareCA(ctx, &v1.PrepareCARequest{}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a second prepare: %v", err)
	}
	f.await(ctx, all, func(b bundleSeen) bool { return b.roots == 2 && b.active == first }, "the prepared bundle")
	for _, a := range agents {
		if !a.mgr.Pin().Trusts(second) {
			t.Fatalf("agent %d does not trust the prepared CA", a.i)
		}
	}

	// Activate: renewals and boots switch to the new CA.
	if _, err := cp.Admin.ActivateCA(ctx, &v1.ActivateCARequest{}); err != nil {
		t.Fatal(err)
	}
	f.await(ctx, all, func(b bundleSeen) bool { return b.active == second }, "the activated bundle")
	prov, err := cp.Admin.ProvisionInstance(ctx, &v1.ProvisionInstanceRequest{Node: fleet.Node, Provider: "external"})
	if err != nil {
		t.Fatal(err)
	}
	if prov.CaFingerprint != second {
		t.Fatalf("a boot after activate is handed %s, want %s", prov.CaFingerprint, second)
	}
	// Boots during the overlap: one handed the new fingerprint, one that
	// was handed the old one before activate.
	newBoot, err := f.newAgent(ctx, n, second, prov.BootstrapToken)
	if err != nil {
		t.Fatalf("a boot pinned to the new CA: %v", err)
	}
	_, oldToken := cp.Provision(ctx, fleet.Node)
	oldBoot, err := f.newAgent(ctx, n+1, first, oldToken)
	if err != nil {
		t.Fatalf("a boot pinned to the old CA during the overlap: %v", err)
	}
	secondSKI := ""
	for _, b := range []*rotAgent{newBoot, oldBoot} {
		id := b.mgr.Current()
		if pki.Fingerprint(id.CA.Raw) != second {
			t.Fatalf("boot %d: certificate issued by %s, want %s", b.i, pki.Fingerprint(id.CA.Raw), second)
		}
		secondSKI = fmt.Sprintf("%x", id.CA.SubjectKeyId)
	}
	if !oldBoot.mgr.Pin().Trusts(second) {
		t.Fatal("the boot pinned to the old CA did not learn the new one")
	}

	// Revocation of a certificate of the old CA ends its stream.
	revokedOld := agents[0]
	if _, err := cp.Admin.RevokeCertificate(ctx, &v1.RevokeCertificateRequest{Serial: ca.SerialString(revokedOld.mgr.Current().Cert)}); err != nil {
		t.Fatal(err)
	}
	waitRevoked(t, ctx, f, revokedOld.i)

	// Half a day on, every other agent renews under the new CA (its
	// certificate outlives the old one's by as much), then reconnects with it
	// (as the agent does), and no stream drops on the way.
	clk.Advance(12 * time.Hour)
	renewing := agents[1:]
	if err := parallel(len(renewing), func(i int) error {
		a := renewing[i]
		id, err := a.mgr.Renew(ctx, v1.NewAgentServiceClient(a.conn))
		if err != nil {
			return fmt.Errorf("agent %d renew: %w", a.i, err)
		}
		if got := issuerOf(id.Cert); got != secondSKI {
			return fmt.Errorf("agent %d renewed under key id %s, want the new CA's %s", a.i, got, secondSKI)
		}
		oldConn, oldStream, oldClosing := a.conn, a.stream, a.closing
		// The new stream replaces the old one as soon as tetherd registers
		// it, which can be before connect returns: the old stream's end is
		// this agent's own doing from here on.
		oldClosing.Store(true)
		if err := f.connect(ctx, a); err != nil {
			return fmt.Errorf("agent %d reconnect: %w", a.i, err)
		}
		_ = oldStream.CloseSend()
		oldConn.Close()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	renewed := map[int]bool{}
	for _, a := range renewing {
		renewed[a.i] = true
	}
	f.await(ctx, renewed, func(b bundleSeen) bool { return b.active == second }, "reconnected under the new CA")
	t.Logf("%d agents renewed and reconnected under the new CA after %s", len(renewing), time.Since(start).Round(time.Millisecond))

	// Revocation of a certificate of the new CA ends its stream too.
	revokedNew := agents[1]
	if _, err := cp.Admin.RevokeCertificate(ctx, &v1.RevokeCertificateRequest{Serial: ca.SerialString(revokedNew.mgr.Current().Cert)}); err != nil {
		t.Fatal(err)
	}
	waitRevoked(t, ctx, f, revokedNew.i)

	// Retire: refused while the old CA's certificates live (the agents'
	// superseded ones, the init admin's).
	_, err = cp.Admin.RetireCA(ctx, &v1.RetireCARequest{Fingerprint: first})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "live certificates") {
		t.Fatalf("retire with live certificates: %v", err)
	}
	// The operator's way out: an admin of the new CA, the old admin revoked.
	key := testcp.NewNodeKey(t)
	ops, err := cp.Admin.CreateIdentity(ctx, &v1.CreateIdentityRequest{Name: "ops", Role: "admin", CsrPem: key.CSRPEM})
	if err != nil {
		t.Fatal(err)
	}
	opsCert := key.Certificate(t, ops.CertificatePem)
	admin := v1.NewAdminServiceClient(cp.Dial(&opsCert))
	if _, err := admin.RevokeIdentity(ctx, &v1.RevokeIdentityRequest{Name: "admin"}); err != nil {
		t.Fatal(err)
	}
	// Another half day: every certificate of the old CA has expired; the
	// renewed ones (24 h from the renewal) have not.
	clk.Advance(12*time.Hour + 2*time.Minute)
	list, err := admin.ListCAs(ctx, &v1.ListCAsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range list.Authorities {
		if c.Fingerprint == first && (c.State != "old" || c.LiveCertificates != 0) {
			t.Fatalf("the old CA before retire: %s with %d live", c.State, c.LiveCertificates)
		}
	}
	if _, err := admin.RetireCA(ctx, &v1.RetireCARequest{Fingerprint: first}); err != nil {
		t.Fatal(err)
	}
	live := map[int]bool{}
	for _, a := range agents[2:] {
		live[a.i] = true
	}
	f.await(ctx, live, func(b bundleSeen) bool { return b.roots == 1 && b.active == second }, "the bundle after retire")
	for _, a := range agents[2:] {
		if a.mgr.Pin().Trusts(first) || !a.mgr.Pin().Trusts(second) {
			t.Fatalf("agent %d after retire: trusts the retired CA %v, the active one %v", a.i, a.mgr.Pin().Trusts(first), a.mgr.Pin().Trusts(second))
		}
	}
	select {
	case err := <-f.drops:
		t.Fatalf("a stream dropped: %v", err)
	default:
	}
	t.Logf("retired after %s", time.Since(start).Round(time.Millisecond))
	// Every step is in the audit trail, the refused ones with their code.
	seen := map[string]bool{}
	for after := int64(0); ; {
		trail, err := admin.ListAudit(ctx, &v1.ListAuditRequest{AfterId: after, PageSize: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range trail.Records {
			if strings.HasSuffix(r.Method, "CA") {
				seen[r.Method[strings.LastIndex(r.Method, "/")+1:]+" "+r.Code] = true
			}
			after = max(after, r.Id)
		}
		// Each read of the trail is audited too: a short page is the end.
		if len(trail.Records) < 1000 {
			break
		}
	}
	for _, want := range []string{"PrepareCA OK", "PrepareCA FailedPrecondition", "ActivateCA OK", "RetireCA FailedPrecondition", "RetireCA OK"} {
		if !seen[want] {
			t.Errorf("no audit record %q in %v", want, seen)
		}
	}
	for _, line := range f.console {
		if strings.Contains(line, "refused (") {
			t.Fatalf("an agent refused a root: %s", line)
		}
	}
}

// waitRevoked waits for agent i's stream to end as revoked.
func waitRevoked(t *testing.T, ctx context.Context, f *rotFleet, i int) {
	t.Helper()
	for {
		select {
		case err := <-f.drops:
			if !strings.Contains(err.Error(), fmt.Sprintf("agent %d:", i)) {
				t.Fatalf("waiting for agent %d's revoked stream, another dropped: %v", i, err)
			}
			if status.Code(errors.Unwrap(err)) != codes.Unauthenticated || !strings.Contains(err.Error(), "revoked") {
				t.Fatalf("agent %d's stream ended with %v, want Unauthenticated: revoked", i, err)
			}
			return
		case <-f.bundles:
		case <-ctx.Done():
			t.Fatalf("agent %d's stream outlived its revocation", i)
		}
	}
}
