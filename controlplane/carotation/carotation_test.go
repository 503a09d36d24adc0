package carotation_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/carotation"
	"github.com/tetherfleet/tether/controlplane/credentials"
	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/postgres"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/testkit/pgtest"
	"github.com/tetherfleet/tether/pki"
	"github.com/tetherfleet/tether/pki/ca"
)

var pg pgtest.Shared

func TestMain(m *testing.M) {
	code := m.Run()
	pg.Close()
	os.Exit(code)
}

var t0 = time.Date(2026, 12, 7, 4, 0, 0, 0, time.UTC)

type backend struct {
	name string
	open func(t *testing.T) store.Store
}

var backends = []backend{
	{"sqlite", func(t *testing.T) store.Store {
		st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "tether.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}},
	{"postgres", func(t *testing.T) store.Store {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		st, err := postgres.Open(ctx, pg.DSN(t), postgres.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}},
}

func eachBackend(t *testing.T, f func(t *testing.T, st store.Store)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { f(t, b.open(t)) })
	}
}

// env is one replica's rotation service over st, its data dir's CA made
// as `tetherd init` makes it.
type env struct {
	dir    string
	sealer *credentials.Sealer
	st     store.Store
	clk    *clock.Fake
	ca     *ca.CA
	svc    *carotation.Service
	first  *x509.Certificate
}

func newEnv(t *testing.T, st store.Store) *env {
	t.Helper()
	clk := clock.NewFake(t0)
	dir := filepath.Join(t.TempDir(), "ca")
	authority, err := ca.Create(dir, "Tether CA", clk)
	if err != nil {
		t.Fatal(err)
	}
	sealer, err := credentials.NewSealer(make([]byte, 32))
	if err != nil {
		t.Fatal(err)
	}
	e := &env{dir: dir, sealer: sealer, st: st, clk: clk, ca: authority, first: authority.Certificate()}
	e.svc = &carotation.Service{Store: st, CA: authority, First: authority.Certificate(), FirstKey: authority.Key(), Sealer: sealer, Clock: clk}
	if err := e.svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) list(t *testing.T) []carotation.CA {
	t.Helper()
	all, err := e.svc.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return all
}

func states(all []carotation.CA) string {
	var out []string
	for _, a := range all {
		out = append(out, a.State)
	}
	return strings.Join(out, ",")
}

func wantRefused(t *testing.T, err error, code codes.Code, says ...string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("err = %v, want %s", err, code)
	}
	for _, s := range says {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("err = %v, want it to say %q", err, s)
		}
	}
}

func (e *env) events(t *testing.T, kind store.EventKind) int {
	t.Helper()
	evs, err := e.st.ListEvents(context.Background(), store.EventFilter{Kind: kind}, store.Page{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	return len(evs)
}

// A whole rotation: each step's state, event and signer; every refusal
// names the state and changes nothing.
func TestRotationSteps(t *testing.T) {
	eachBackend(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		e := newEnv(t, st)
		firstFP := pki.Fingerprint(e.first.Raw)
		if got := e.list(t); len(got) != 1 || got[0].State != store.AuthorityActive || got[0].Fingerprint != firstFP {
			t.Fatalf("after start: %+v", got)
		}
		if e.events(t, events.CAAdopted) != 1 {
			t.Fatal("no ca.adopted event")
		}

		// Nothing prepared: activate refuses; the only CA cannot retire.
		_, err := e.svc.Activate(ctx, "", "alice")
		wantRefused(t, err, codes.FailedPrecondition, "no CA is prepared", "tetherctl ca prepare")
		_, err = e.svc.Retire(ctx, firstFP, "alice")
		wantRefused(t, err, codes.FailedPrecondition, "active and the only CA")

		e.clk.Advance(time.Minute) // the set lists by creation time
		prepared, err := e.svc.Prepare(ctx, "", "alice")
		if err != nil {
			t.Fatal(err)
		}
		if prepared.State != store.AuthorityPrepared || e.ca.Fingerprint() != firstFP || len(e.ca.Roots()) != 2 {
			t.Fatalf("after prepare: %s, signer %s, %d roots", prepared.State, e.ca.Fingerprint(), len(e.ca.Roots()))
		}
		// Started twice: refused, the prepared CA kept.
		_, err = e.svc.Prepare(ctx, "ed25519", "alice")
		wantRefused(t, err, codes.FailedPrecondition, "already prepared", prepared.Fingerprint)
		_, err = e.svc.Prepare(ctx, "rsa", "alice")
		wantRefused(t, err, codes.InvalidArgument, "key_type")
		if got := e.list(t); states(got) != "active,prepared" || got[1].Fingerprint != prepared.Fingerprint {
			t.Fatalf("after a second prepare: %s", states(got))
		}
		// Activate names what it activates; an active or unknown one is refused.
		_, err = e.svc.Activate(ctx, firstFP, "alice")
		wantRefused(t, err, codes.FailedPrecondition, "is active, not prepared")
		_, err = e.svc.Activate(ctx, "sha256:"+strings.Repeat("0", 64), "alice")
		wantRefused(t, err, codes.NotFound)
		_, err = e.svc.Activate(ctx, "nonsense", "alice")
		wantRefused(t, err, codes.InvalidArgument, "fingerprint")

		// A node certificate signed by the first CA stays live.
		csr := newCSR(t)
		old, err := e.ca.SignNode(ctx, csr, "i1", 0)
		if err != nil {
			t.Fatal(err)
		}
		record(t, st, old, pki.Fingerprint(e.ca.IssuerOf(old).Raw), t0)

		active, err := e.svc.Activate(ctx, "", "alice")
		if err != nil {
			t.Fatal(err)
		}
		if active.Fingerprint != prepared.Fingerprint || e.ca.Fingerprint() != prepared.Fingerprint {
			t.Fatalf("activated %s, signer %s, want %s", active.Fingerprint, e.ca.Fingerprint(), prepared.Fingerprint)
		}
		renewed, err := e.ca.SignNode(ctx, csr, "i1", 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := pki.Fingerprint(e.ca.IssuerOf(renewed).Raw); got != prepared.Fingerprint {
			t.Fatalf("renewal signed by %s, want the active %s", got, prepared.Fingerprint)
		}
		record(t, st, renewed, prepared.Fingerprint, t0)
		// Both verify: the old root is still trusted.
		for _, c := range []*x509.Certificate{old, renewed} {
			if _, err := e.ca.Verify(c, x509.ExtKeyUsageClientAuth); err != nil {
				t.Fatalf("certificate of %s: %v", pki.Fingerprint(e.ca.IssuerOf(c).Raw), err)
			}
		}
		got := e.list(t)
		if states(got) != "old,active" || got[0].Live != 1 || got[1].Live != 1 {
			t.Fatalf("after activate: %s, live %d %d", states(got), got[0].Live, got[1].Live)
		}

		// Retire: the active is refused, the old one while it has live
		// certificates; after they expire it goes.
		_, err = e.svc.Retire(ctx, prepared.Fingerprint, "alice")
		wantRefused(t, err, codes.FailedPrecondition, "is active: activate another")
		_, err = e.svc.Retire(ctx, firstFP, "alice")
		wantRefused(t, err, codes.FailedPrecondition, "still has 1 live certificates")
		_, err = e.svc.Retire(ctx, "", "alice")
		wantRefused(t, err, codes.InvalidArgument, "fingerprint")
		if states(e.list(t)) != "old,active" {
			t.Fatal("a refused retire changed the set")
		}
		e.clk.Advance(25 * time.Hour)
		// The renewal (recorded at t0 too) has expired as well: the
		// lifetime is the default 24 h. Only the first CA's count matters.
		retired, err := e.svc.Retire(ctx, firstFP, "alice")
		if err != nil {
			t.Fatal(err)
		}
		if retired.State != store.AuthorityRetired || len(e.ca.Roots()) != 1 {
			t.Fatalf("retired %s; %d roots trusted", retired.State, len(e.ca.Roots()))
		}
		if _, err := e.ca.Verify(old, x509.ExtKeyUsageClientAuth); err == nil {
			t.Fatal("a certificate of the retired CA still verifies")
		}
		_, err = e.svc.Retire(ctx, firstFP, "alice")
		wantRefused(t, err, codes.FailedPrecondition, "retired already")
		for _, k := range []store.EventKind{events.CAPrepared, events.CAActivated, events.CARetired} {
			if n := e.events(t, k); n != 1 {
				t.Fatalf("%d %s events, want 1", n, k)
			}
		}
		// The next rotation cross-signs with the new active CA; abandoned
		// (its prepared CA retired), it can start again.
		e.clk.Advance(time.Minute)
		next, err := e.svc.Prepare(ctx, "ed25519", "alice")
		if err != nil {
			t.Fatal(err)
		}
		bundle := e.svc.Bundle()
		if len(bundle.Roots) != 2 || bundle.ActiveFingerprint != prepared.Fingerprint {
			t.Fatalf("bundle with the next CA prepared: %d roots, active %s", len(bundle.Roots), bundle.ActiveFingerprint)
		}
		cross, err := ca.ParseCertificatePEM([]byte(bundle.Roots[1].CrossPem))
		if err != nil {
			t.Fatal(err)
		}
		if err := cross.CheckSignatureFrom(e.ca.Certificate()); err != nil {
			t.Fatalf("the next CA is not cross-signed by the active one: %v", err)
		}
		if _, err := e.svc.Retire(ctx, next.Fingerprint, "alice"); err != nil {
			t.Fatalf("abandoning a prepared CA: %v", err)
		}
		if _, err := e.svc.Prepare(ctx, "", "alice"); err != nil {
			t.Fatalf("prepare after an abandoned rotation: %v", err)
		}
	})
}

func newCSR(t *testing.T) *x509.CertificateRequest {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		t.Fatal(err)
	}
	return csr
}

func record(t *testing.T, st store.Store, c *x509.Certificate, issuer string, now time.Time) {
	t.Helper()
	if err := st.CreateCertificate(context.Background(), &store.Certificate{Serial: store.CertSerial(ca.SerialString(c)), InstanceID: "",
		Kind: store.CertKindNode, Issuer: issuer, NotBefore: c.NotBefore, NotAfter: c.NotAfter, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
}

// Another replica follows: it loads the prepared CA's key from the store
// (sealed under the shared credentials.key) and signs with it once active;
// a replica with another credentials.key cannot, and says so.
func TestReplicasShareTheSet(t *testing.T) {
	eachBackend(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		e := newEnv(t, st)
		e.clk.Advance(time.Minute) // the set lists by creation time
		if _, err := e.svc.Prepare(ctx, "", "alice"); err != nil {
			t.Fatal(err)
		}
		active, err := e.svc.Activate(ctx, "", "alice")
		if err != nil {
			t.Fatal(err)
		}
		// The second replica: the same data dir's files, the same key.
		second, err := ca.Load(e.dir, e.clk)
		if err != nil {
			t.Fatal(err)
		}
		svc2 := &carotation.Service{Store: st, CA: second, First: second.Certificate(), FirstKey: second.Key(), Sealer: e.sealer, Clock: e.clk}
		if err := svc2.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if second.Fingerprint() != active.Fingerprint {
			t.Fatalf("second replica signs with %s, want %s", second.Fingerprint(), active.Fingerprint)
		}
		c, err := second.SignNode(ctx, newCSR(t), "i2", 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.ca.Verify(c, x509.ExtKeyUsageClientAuth); err != nil {
			t.Fatalf("the first replica refuses what the second signed: %v", err)
		}
		if b := svc2.Bundle(); len(b.Roots) != 2 || b.ActiveFingerprint != active.Fingerprint || b.Roots[1].CrossPem == "" {
			t.Fatalf("bundle: %d roots, active %s", len(b.Roots), b.ActiveFingerprint)
		}

		third, err := ca.Load(e.dir, e.clk)
		if err != nil {
			t.Fatal(err)
		}
		wrong, _ := credentials.NewSealer([]byte(strings.Repeat("x", 32)))
		svc3 := &carotation.Service{Store: st, CA: third, First: third.Certificate(), FirstKey: third.Key(), Sealer: wrong, Clock: e.clk}
		if err := svc3.Start(ctx); err == nil || !strings.Contains(err.Error(), "credentials.key") {
			t.Fatalf("a replica with another credentials.key: err = %v", err)
		}
	})
}

// A data dir whose CA the store does not know belongs to another fleet.
func TestForeignDataDirRefused(t *testing.T) {
	eachBackend(t, func(t *testing.T, st store.Store) {
		newEnv(t, st)
		e2 := newEnv2(t, st)
		err := e2.Start(context.Background())
		if err == nil || !strings.Contains(err.Error(), "belongs to another control plane") {
			t.Fatalf("err = %v", err)
		}
	})
}

func newEnv2(t *testing.T, st store.Store) *carotation.Service {
	clk := clock.NewFake(t0)
	authority, err := ca.Create(filepath.Join(t.TempDir(), "ca"), "Tether CA", clk)
	if err != nil {
		t.Fatal(err)
	}
	sealer, _ := credentials.NewSealer(make([]byte, 32))
	return &carotation.Service{Store: st, CA: authority, First: authority.Certificate(), FirstKey: authority.Key(), Sealer: sealer, Clock: clk}
}

// Replicas of one data dir starting together on an empty set: one records
// the CA, the others find it; none fails to start.
func TestReplicasStartTogether(t *testing.T) {
	eachBackend(t, func(t *testing.T, st store.Store) {
		clk := clock.NewFake(t0)
		dir := filepath.Join(t.TempDir(), "ca")
		if _, err := ca.Create(dir, "Tether CA", clk); err != nil {
			t.Fatal(err)
		}
		sealer, _ := credentials.NewSealer(make([]byte, 32))
		errs := make(chan error, 4)
		for range 4 {
			go func() {
				authority, err := ca.Load(dir, clk)
				if err != nil {
					errs <- err
					return
				}
				svc := &carotation.Service{Store: st, CA: authority, First: authority.Certificate(), FirstKey: authority.Key(), Sealer: sealer, Clock: clk}
				errs <- svc.Start(context.Background())
			}()
		}
		for range 4 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		all, err := st.ListAuthorities(context.Background())
		if err != nil || len(all) != 1 {
			t.Fatalf("authorities %d, %v", len(all), err)
		}
	})
}
