package enroll_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/enroll"
	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/pki"
	"github.com/tetherfleet/tether/pki/ca"
)

type fixture struct {
	dir   string
	st    *sqlite.Store
	svc   *enroll.Service
	clk   *clock.Fake
	inst  *store.Instance
	token string
}

func setup(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	clk := clock.NewFake(time.Now())
	st, err := sqlite.Open(ctx, filepath.Join(dir, "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	authority, err := ca.Create(filepath.Join(dir, "ca"), "test", clk)
	if err != nil {
		t.Fatal(err)
	}
	now := clk.Now()
	m := &store.Module{Name: "base", Version: "1", Digest: "sha256:" + strings.Repeat("0", 63) + "1", Size: 1, CreatedAt: now}
	must(t, st.CreateModule(ctx, m))
	tpl := &store.Template{Name: "web", RootModules: []store.ModuleRef{{Name: "base", Version: "1"}}, CreatedAt: now, UpdatedAt: now}
	must(t, st.CreateTemplate(ctx, tpl))
	n := &store.Node{Name: "edge", TemplateID: tpl.ID, Enabled: true, CreatedAt: now, UpdatedAt: now}
	must(t, st.CreateNode(ctx, n))
	inst := &store.Instance{NodeID: n.ID, Status: lifecycle.Provisioning, Provider: "external", CreatedAt: now, UpdatedAt: now}
	must(t, st.CreateInstance(ctx, inst))
	token, hash, err := pki.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	must(t, st.CreateToken(ctx, &store.Token{Hash: hash, InstanceID: inst.ID, ExpiresAt: now.Add(time.Hour), CreatedAt: now}))
	return &fixture{dir: dir, st: st, clk: clk, inst: inst, token: token,
		svc: &enroll.Service{Store: st, CA: authority, Clock: clk, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func csrPEM(t testing.TB) (ed25519.PublicKey, string) {
	t.Helper()
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	return pub, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

func countEvents(t *testing.T, st store.Store, kind store.EventKind) int {
	t.Helper()
	evs, err := st.ListEvents(context.Background(), store.EventFilter{Kind: kind}, store.Page{Limit: 100})
	must(t, err)
	return len(evs)
}

func wantRefused(t *testing.T, err error) {
	t.Helper()
	if status.Code(fail.From(err)) != codes.Unauthenticated {
		t.Fatalf("got %v, want the Unauthenticated refusal", err)
	}
}

// TestEnrollIssuesOnceAndRecords: the certificate names the instance and
// carries the CSR's key; the token is spent; the certificate and the
// enroll.succeeded event are recorded; a replay is refused, also after the
// store is reopened (the spent mark is durable, not in memory).
func TestEnrollIssuesOnceAndRecords(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	pub, csr := csrPEM(t)
	issued, err := f.svc.Enroll(ctx, f.token, csr)
	must(t, err)
	if issued.InstanceID != f.inst.ID || !pub.Equal(issued.Cert.PublicKey) {
		t.Fatalf("issued %+v for %s", issued, f.inst.ID)
	}
	id, err := pki.IdentityOf(issued.Cert)
	if err != nil || id.Kind != pki.KindInstance || id.Name != f.inst.ID.String() {
		t.Fatalf("identity %+v (%v)", id, err)
	}
	if _, err := f.st.GetCertificate(ctx, store.CertSerial(ca.SerialString(issued.Cert))); err != nil {
		t.Fatalf("certificate not recorded: %v", err)
	}
	if n := countEvents(t, f.st, events.EnrollSucceeded); n != 1 {
		t.Fatalf("%d enroll.succeeded events, want 1", n)
	}

	_, csr2 := csrPEM(t)
	_, err = f.svc.Enroll(ctx, f.token, csr2)
	wantRefused(t, err)

	// Reopen the store, as a restarted tetherd would.
	must(t, f.st.Close())
	st, err := sqlite.Open(ctx, filepath.Join(f.dir, "tether.db"))
	must(t, err)
	defer st.Close()
	svc := &enroll.Service{Store: st, CA: f.svc.CA, Clock: f.clk, Log: f.svc.Log}
	_, err = svc.Enroll(ctx, f.token, csr2)
	wantRefused(t, err)
	// One high event per process's coalescing window: the restarted one
	// starts its own.
	if n := countEvents(t, st, events.EnrollTokenReused); n != 2 {
		t.Fatalf("%d enroll.token_reused events for a replay before and after a restart, want 2", n)
	}
}

// TestEnrollRacingTerminationIsRefused: a token still unexpired while its
// instance is terminated (the termination has not expired it yet) passes
// the read before signing, and the transaction refuses it: no certificate,
// the token left as it was, a refusal event.
func TestEnrollRacingTerminationIsRefused(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	f.inst.Status = lifecycle.Terminated
	must(t, f.st.UpdateInstance(ctx, f.inst))

	_, csr := csrPEM(t)
	_, err := f.svc.Enroll(ctx, f.token, csr)
	wantRefused(t, err)
	tok, err := f.st.GetToken(ctx, pki.HashToken(f.token))
	must(t, err)
	if tok.UsedAt != nil {
		t.Fatal("a refused enrollment spent the token")
	}
	certs, err := f.st.ListCertificates(ctx, store.CertificateFilter{InstanceID: f.inst.ID}, store.Page{Limit: 10})
	must(t, err)
	if len(certs) != 0 {
		t.Fatalf("%d certificates recorded for a terminated instance", len(certs))
	}
	if n := countEvents(t, f.st, events.EnrollRefused); n != 1 {
		t.Fatalf("%d enroll.refused events, want 1", n)
	}
	if n := countEvents(t, f.st, events.EnrollSucceeded); n != 0 {
		t.Fatalf("%d enroll.succeeded events, want none", n)
	}
}

// TestEnrollConcurrentReplaysIssueOne: many enrollments racing on one
// token: exactly one certificate, and the losers are recorded as replays.
func TestEnrollConcurrentReplaysIssueOne(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	const n = 16
	errs := make(chan error, n)
	for range n {
		_, csr := csrPEM(t)
		go func() {
			_, err := f.svc.Enroll(ctx, f.token, csr)
			errs <- err
		}()
	}
	ok := 0
	for range n {
		if err := <-errs; err == nil {
			ok++
		} else if status.Code(fail.From(err)) != codes.Unauthenticated {
			t.Fatalf("unexpected error %v", err)
		}
	}
	if ok != 1 {
		t.Fatalf("%d enrollments succeeded with one token, want 1", ok)
	}
	// The losers are replays: one high event for the window (this race
	// used to crash tetherd on a nil used_at).
	if n := countEvents(t, f.st, events.EnrollTokenReused); n != 1 {
		t.Fatalf("%d enroll.token_reused events, want 1", n)
	}
}

// TestEnrollRetriedForTheSameKey: a node whose answer was lost retries
// with its spent token and the same CSR and gets a certificate for the
// same key again (enroll.retried); the same token for another key is a
// replay, refused; and the retry is refused too once the token would have
// expired, or the instance was terminated.
func TestEnrollRetriedForTheSameKey(t *testing.T) {
	tests := []struct {
		name    string
		prepare func(*fixture)
		sameKey bool
		wantOK  bool
	}{
		{"same key", func(*fixture) {}, true, true},
		{"another key", func(*fixture) {}, false, false},
		{"same key after the token's life", func(f *fixture) { f.clk.Advance(2 * time.Hour) }, true, false},
		{"same key, instance terminated", func(f *fixture) {
			f.inst.Status = lifecycle.Terminated
			must(t, f.st.UpdateInstance(context.Background(), f.inst))
		}, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := setup(t)
			ctx := context.Background()
			pub, csr := csrPEM(t)
			first, err := f.svc.Enroll(ctx, f.token, csr)
			must(t, err)
			tc.prepare(f)
			again := csr
			if !tc.sameKey {
				_, again = csrPEM(t)
			}
			second, err := f.svc.Enroll(ctx, f.token, again)
			if !tc.wantOK {
				wantRefused(t, err)
				if n := countEvents(t, f.st, events.EnrollRetried); n != 0 {
					t.Fatalf("%d enroll.retried events for a refused retry", n)
				}
				return
			}
			must(t, err)
			if second.InstanceID != f.inst.ID || !pub.Equal(second.Cert.PublicKey) ||
				ca.SerialString(second.Cert) == ca.SerialString(first.Cert) {
				t.Fatalf("retry issued %s for %s (first %s)", ca.SerialString(second.Cert), second.InstanceID, ca.SerialString(first.Cert))
			}
			if _, err := f.st.GetCertificate(ctx, store.CertSerial(ca.SerialString(second.Cert))); err != nil {
				t.Fatalf("the retry's certificate is not recorded: %v", err)
			}
			if n := countEvents(t, f.st, events.EnrollRetried); n != 1 {
				t.Fatalf("%d enroll.retried events, want 1", n)
			}
			if n := countEvents(t, f.st, events.EnrollTokenReused); n != 0 {
				t.Fatalf("a retry for the same key was recorded as a replay (%d events)", n)
			}
		})
	}
}

// TestEnrollRetryRacingItsFirstAttempt: an agent that retries while its
// first attempt is still being answered sends the same CSR twice at once;
// both are answered with certificates for its key, and nothing is
// recorded as a replay.
func TestEnrollRetryRacingItsFirstAttempt(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	_, csr := csrPEM(t)
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			_, err := f.svc.Enroll(ctx, f.token, csr)
			errs <- err
		}()
	}
	for range 8 {
		must(t, <-errs)
	}
	if n := countEvents(t, f.st, events.EnrollTokenReused); n != 0 {
		t.Fatalf("%d enroll.token_reused events for one key's own retries", n)
	}
}
