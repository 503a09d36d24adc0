package enroll_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/agent/tpm"
	"github.com/tetherfleet/tether/controlplane/enroll"
	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/postgres"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/testkit/pgtest"
	"github.com/tetherfleet/tether/internal/testkit/swtpmtest"
	"github.com/tetherfleet/tether/pki"
	"github.com/tetherfleet/tether/pki/attestation"
	"github.com/tetherfleet/tether/pki/ca"
)

var pg pgtest.Shared

func TestMain(m *testing.M) { os.Exit(pg.Run(m)) }

// attestEnv is one store with a template, two nodes ("edge" holding
// ekHashes, "other") and a provisioning instance on edge.
type attestEnv struct {
	st    store.Store
	svc   *enroll.Service
	clk   *clock.Fake
	edge  *store.Node
	other *store.Node
	inst  *store.Instance
}

// stores runs fn on SQLite and on PostgreSQL (skipped loudly without it).
func stores(t *testing.T, fn func(t *testing.T, open func(t *testing.T) store.Store)) {
	t.Run("sqlite", func(t *testing.T) {
		fn(t, func(t *testing.T) store.Store {
			st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "tether.db"))
			must(t, err)
			t.Cleanup(func() { st.Close() })
			return st
		})
	})
	t.Run("postgres", func(t *testing.T) {
		fn(t, func(t *testing.T) store.Store {
			st, err := postgres.Open(context.Background(), pg.DSN(t), postgres.Options{})
			must(t, err)
			t.Cleanup(func() { st.Close() })
			return st
		})
	})
}

func newAttestEnv(t testing.TB, st store.Store, edgeEKs, otherEKs []string) *attestEnv {
	t.Helper()
	ctx := context.Background()
	clk := clock.NewFake(time.Now())
	authority, err := ca.Create(filepath.Join(t.TempDir(), "ca"), "test", clk)
	must(t, err)
	now := clk.Now()
	m := &store.Module{Name: "base", Version: "1", Digest: "sha256:" + strings.Repeat("0", 63) + "1", Size: 1, CreatedAt: now}
	must(t, st.CreateModule(ctx, m))
	tpl := &store.Template{Name: "web", RootModules: []store.ModuleRef{{Name: "base", Version: "1"}}, CreatedAt: now, UpdatedAt: now}
	must(t, st.CreateTemplate(ctx, tpl))
	edge := &store.Node{Name: "edge", TemplateID: tpl.ID, Enabled: true, EKHashes: edgeEKs, CreatedAt: now, UpdatedAt: now}
	other := &store.Node{Name: "other", TemplateID: tpl.ID, Enabled: true, EKHashes: otherEKs, CreatedAt: now, UpdatedAt: now}
	for _, n := range []*store.Node{edge, other} {
		must(t, st.Tx(ctx, func(q store.Queries) error { return q.CreateNode(ctx, n) }))
	}
	inst := &store.Instance{NodeID: edge.ID, Status: lifecycle.Provisioning, Provider: "qemu", CreatedAt: now, UpdatedAt: now}
	must(t, st.CreateInstance(ctx, inst))
	return &attestEnv{st: st, clk: clk, edge: edge, other: other, inst: inst,
		svc: &enroll.Service{Store: st, CA: authority, Clock: clk, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}}
}

// fakeEK is an RSA public key in the EK's PKIX form, and its hash.
func fakeEK(t *testing.T) ([]byte, string) {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	must(t, err)
	der, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	must(t, err)
	h, err := attestation.EKHashDER(der)
	must(t, err)
	return der, h
}

// TestAttestedBeginRefusals: every refusal that is decided before the
// TPM is asked anything names what was wrong, writes the event it should
// (high severity for a TPM that is not the node's), and issues nothing.
func TestAttestedBeginRefusals(t *testing.T) {
	ekDER, ekHash := fakeEK(t)
	_, otherHash := fakeEK(t)
	_, registered := fakeEK(t)
	_, csr := csrPEM(t)

	tests := []struct {
		name      string
		edgeEKs   []string
		otherEKs  []string
		terminate bool
		begin     func(e *attestEnv) enroll.Begin
		code      codes.Code
		say       []string
		event     store.EventKind
		severity  store.Severity
	}{
		{name: "no instance id", begin: func(e *attestEnv) enroll.Begin { return enroll.Begin{CSRPEM: csr, EKPublic: ekDER} },
			code: codes.InvalidArgument, say: []string{"begin.instance_id"}},
		{name: "no CSR", begin: func(e *attestEnv) enroll.Begin { return enroll.Begin{InstanceID: e.inst.ID, EKPublic: ekDER} },
			code: codes.InvalidArgument, say: []string{"begin.csr_pem"}},
		{name: "no EK", begin: func(e *attestEnv) enroll.Begin { return enroll.Begin{InstanceID: e.inst.ID, CSRPEM: csr} },
			code: codes.InvalidArgument, say: []string{"begin.ek_public"}},
		{name: "EK not a public key", begin: func(e *attestEnv) enroll.Begin {
			return enroll.Begin{InstanceID: e.inst.ID, CSRPEM: csr, EKPublic: []byte("not DER")}
		}, code: codes.InvalidArgument, say: []string{"begin.ek_public"}},
		{name: "CSR not a CSR", begin: func(e *attestEnv) enroll.Begin {
			return enroll.Begin{InstanceID: e.inst.ID, CSRPEM: "garbage", EKPublic: ekDER}
		}, code: codes.InvalidArgument, say: []string{"begin.csr_pem"}},
		{name: "unknown instance", edgeEKs: []string{ekHash}, begin: func(e *attestEnv) enroll.Begin {
			return enroll.Begin{InstanceID: "nope", CSRPEM: csr, EKPublic: ekDER}
		}, code: codes.PermissionDenied, say: []string{"no instance nope"}, event: events.EnrollRefused, severity: events.Medium},
		{name: "terminated instance", edgeEKs: []string{ekHash}, terminate: true, begin: func(e *attestEnv) enroll.Begin {
			return enroll.Begin{InstanceID: e.inst.ID, CSRPEM: csr, EKPublic: ekDER}
		}, code: codes.FailedPrecondition, say: []string{"terminated"}, event: events.EnrollRefused, severity: events.Medium},
		{name: "node has no EK bound", begin: func(e *attestEnv) enroll.Begin {
			return enroll.Begin{InstanceID: e.inst.ID, CSRPEM: csr, EKPublic: ekDER}
		}, code: codes.FailedPrecondition, say: []string{"node edge has no EK bound", "tetherctl node update edge --ek " + ekHash},
			event: events.EnrollRefused, severity: events.Medium},
		{name: "another TPM on a node that has one", edgeEKs: []string{registered}, begin: func(e *attestEnv) enroll.Begin {
			return enroll.Begin{InstanceID: e.inst.ID, CSRPEM: csr, EKPublic: ekDER}
		}, code: codes.PermissionDenied, say: []string{ekHash, registered}, event: events.EnrollEKMismatch, severity: events.High},
		{name: "EK of another node", edgeEKs: []string{otherHash}, otherEKs: []string{ekHash}, begin: func(e *attestEnv) enroll.Begin {
			return enroll.Begin{InstanceID: e.inst.ID, CSRPEM: csr, EKPublic: ekDER}
		}, code: codes.PermissionDenied, say: []string{ekHash, "bound to node other", "node edge"}, event: events.EnrollEKMismatch, severity: events.High},
		{name: "AK missing", edgeEKs: []string{ekHash}, begin: func(e *attestEnv) enroll.Begin {
			return enroll.Begin{InstanceID: e.inst.ID, CSRPEM: csr, EKPublic: ekDER}
		}, code: codes.InvalidArgument, say: []string{"begin"}, event: events.EnrollRefused, severity: events.Medium},
	}
	stores(t, func(t *testing.T, open func(t *testing.T) store.Store) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				ctx := context.Background()
				e := newAttestEnv(t, open(t), tt.edgeEKs, tt.otherEKs)
				if tt.terminate {
					e.inst.Status = lifecycle.Terminated
					must(t, e.st.UpdateInstance(ctx, e.inst))
				}
				for range 3 {
					_, _, err := e.svc.BeginAttested(ctx, tt.begin(e))
					st := status.Convert(fail.From(err))
					if st.Code() != tt.code {
						t.Fatalf("code = %v (%v), want %v", st.Code(), err, tt.code)
					}
					for _, s := range tt.say {
						if !strings.Contains(st.Message(), s) {
							t.Errorf("message %q does not say %q", st.Message(), s)
						}
					}
				}
				certs, err := e.st.ListCertificates(ctx, store.CertificateFilter{InstanceID: e.inst.ID}, store.Page{Limit: 10})
				must(t, err)
				if len(certs) != 0 {
					t.Fatalf("%d certificates issued on a refusal", len(certs))
				}
				if n := countEvents(t, e.st, events.EnrollSucceeded); n != 0 {
					t.Fatalf("%d enroll.succeeded events on a refusal", n)
				}
				if tt.event == "" {
					return
				}
				evs, err := e.st.ListEvents(ctx, store.EventFilter{Kind: tt.event}, store.Page{Limit: 10})
				must(t, err)
				// Three tries in one window are one event: a refusal
				// costs the refused nothing, so it must cost the log little.
				if len(evs) != 1 {
					t.Fatalf("%d %s events after three refusals, want 1 (coalesced)", len(evs), tt.event)
				}
				if evs[0].Severity != tt.severity {
					t.Errorf("severity %d, want %d", evs[0].Severity, tt.severity)
				}
				if tt.severity == events.High {
					for _, s := range tt.say {
						if !strings.Contains(evs[0].Message, s) {
							t.Errorf("event %q does not name %q", evs[0].Message, s)
						}
					}
				}
			})
		}
	})
}

// tpmMachine is a software TPM opened the way the agent opens one.
type tpmMachine struct {
	tpm *tpm.TPM
	ek  tpm.EK
	// hash is the EK's, as `node update --ek` takes it.
	hash string
}

func newTPMMachine(t *testing.T) *tpmMachine {
	t.Helper()
	sw := swtpmtest.Start(t)
	tp, err := tpm.OpenChannel(sw.Dial(t), nil)
	must(t, err)
	t.Cleanup(func() { tp.Close() })
	ek, err := tp.EK()
	must(t, err)
	h, err := attestation.EKHashDER(ek.PublicDER)
	must(t, err)
	return &tpmMachine{tpm: tp, ek: ek, hash: h}
}

// begin opens an attested enrollment for instanceID with a fresh AK.
func (m *tpmMachine) begin(t *testing.T, svc *enroll.Service, instanceID store.InstanceID) (*enroll.Attestation, attestation.Challenge, *tpm.AK, []byte, error) {
	t.Helper()
	ak, err := m.tpm.NewAK()
	must(t, err)
	t.Cleanup(func() { ak.Close() })
	_, csr := csrPEM(t)
	a, c, err := svc.BeginAttested(context.Background(), enroll.Begin{InstanceID: instanceID, CSRPEM: csr,
		EKPublic: m.ek.PublicDER, EKCertificate: m.ek.CertificateDER, AK: ak.Params()})
	block, _ := pem.Decode([]byte(csr))
	return a, c, ak, block.Bytes, err
}

// proof activates c and quotes for a.
func proof(t *testing.T, a *enroll.Attestation, c attestation.Challenge, ak *tpm.AK, csrDER []byte) ([]byte, attestation.Evidence) {
	t.Helper()
	secret, err := ak.Activate(c)
	must(t, err)
	ev, err := ak.Quote(attestation.Nonce(a.ID, secret, csrDER))
	must(t, err)
	return secret, ev
}

// TestAttestedEnrollment: a machine whose TPM is bound to its node
// enrolls with no token; replays of an earlier enrollment's activation or
// quote, a wrong secret, and an EK unbound mid-way are refused and issue
// nothing; an impostor racing the genuine machine loses, alone.
func TestAttestedEnrollment(t *testing.T) {
	m := newTPMMachine(t)
	impostor := newTPMMachine(t)
	stores(t, func(t *testing.T, open func(t *testing.T) store.Store) {
		ctx := context.Background()
		e := newAttestEnv(t, open(t), []string{m.hash}, nil)
		certs := func() int {
			cs, err := e.st.ListCertificates(ctx, store.CertificateFilter{InstanceID: e.inst.ID}, store.Page{Limit: 100})
			must(t, err)
			return len(cs)
		}

		a1, c1, ak1, csr1, err := m.begin(t, e.svc, e.inst.ID)
		must(t, err)
		s1, ev1 := proof(t, a1, c1, ak1, csr1)
		issued, err := e.svc.FinishAttested(ctx, a1, s1, ev1)
		must(t, err)
		if issued.InstanceID != e.inst.ID || certs() != 1 {
			t.Fatalf("issued %+v with %d certificates recorded", issued, certs())
		}
		evs, err := e.st.ListEvents(ctx, store.EventFilter{Kind: events.EnrollSucceeded}, store.Page{Limit: 10})
		must(t, err)
		if len(evs) != 1 || !strings.Contains(string(evs[0].Payload), `"attested":true`) || !strings.Contains(string(evs[0].Payload), m.hash) {
			t.Fatalf("enroll.succeeded events %+v, want one naming the attestation and the EK", evs)
		}

		refusals := []struct {
			name string
			run  func(t *testing.T) error
			code codes.Code
		}{
			{"the first enrollment's activated secret", func(t *testing.T) error {
				a, c, ak, csr, err := m.begin(t, e.svc, e.inst.ID)
				must(t, err)
				_, ev := proof(t, a, c, ak, csr)
				_, err = e.svc.FinishAttested(ctx, a, s1, ev)
				return err
			}, codes.PermissionDenied},
			{"the first enrollment's quote", func(t *testing.T) error {
				a, c, ak, csr, err := m.begin(t, e.svc, e.inst.ID)
				must(t, err)
				s, _ := proof(t, a, c, ak, csr)
				_, err = e.svc.FinishAttested(ctx, a, s, ev1)
				return err
			}, codes.PermissionDenied},
			{"a secret the TPM did not release", func(t *testing.T) error {
				a, c, ak, csr, err := m.begin(t, e.svc, e.inst.ID)
				must(t, err)
				_, ev := proof(t, a, c, ak, csr)
				_, err = e.svc.FinishAttested(ctx, a, make([]byte, 32), ev)
				return err
			}, codes.PermissionDenied},
			{"an EK unbound between challenge and proof", func(t *testing.T) error {
				a, c, ak, csr, err := m.begin(t, e.svc, e.inst.ID)
				must(t, err)
				s, ev := proof(t, a, c, ak, csr)
				e.edge.EKHashes = nil
				must(t, e.st.Tx(ctx, func(q store.Queries) error { return q.UpdateNode(ctx, e.edge) }))
				defer func() {
					e.edge.EKHashes = []string{m.hash}
					must(t, e.st.Tx(ctx, func(q store.Queries) error { return q.UpdateNode(ctx, e.edge) }))
				}()
				_, err = e.svc.FinishAttested(ctx, a, s, ev)
				return err
			}, codes.FailedPrecondition},
		}
		for _, r := range refusals {
			t.Run(r.name, func(t *testing.T) {
				before := certs()
				err := r.run(t)
				if got := status.Code(fail.From(err)); got != r.code {
					t.Fatalf("code %v (%v), want %v", got, err, r.code)
				}
				if certs() != before {
					t.Fatal("a refused attestation recorded a certificate")
				}
			})
		}

		t.Run("an impostor racing the machine", func(t *testing.T) {
			before := certs()
			a, c, ak, csr, err := m.begin(t, e.svc, e.inst.ID)
			must(t, err)
			s, ev := proof(t, a, c, ak, csr)
			done := make(chan error, 2)
			go func() { _, err := e.svc.FinishAttested(ctx, a, s, ev); done <- err }()
			go func() { _, _, _, _, err := impostor.begin(t, e.svc, e.inst.ID); done <- err }()
			var ok, refused int
			for range 2 {
				switch err := <-done; status.Code(fail.From(err)) {
				case codes.OK:
					ok++
				case codes.PermissionDenied:
					refused++
				default:
					t.Errorf("unexpected %v", err)
				}
			}
			if ok != 1 || refused != 1 || certs() != before+1 {
				t.Fatalf("%d issued, %d refused, %d certificates more; want 1, 1, 1", ok, refused, certs()-before)
			}
			evs, err := e.st.ListEvents(ctx, store.EventFilter{Kind: events.EnrollEKMismatch}, store.Page{Limit: 10})
			must(t, err)
			if len(evs) != 1 || !strings.Contains(evs[0].Message, impostor.hash) || !strings.Contains(evs[0].Message, m.hash) {
				t.Fatalf("ek_mismatch events %+v, want one naming both EKs", evs)
			}
		})
	})
}

// TestTwoAgentsOfOneTPMRacing: two agents on the machine that holds the
// node's TPM (a boot restarted mid-enrollment, a second agent started by
// hand) attest for the same instance at once, each with its own AK and
// key. Both proofs are genuine, so whatever the interleaving every answer
// is an issued certificate or a clear refusal, each issued one is recorded
// with its own enroll.succeeded event, and neither store deadlocks or
// answers Internal.
func TestTwoAgentsOfOneTPMRacing(t *testing.T) {
	m := newTPMMachine(t)
	stores(t, func(t *testing.T, open func(t *testing.T) store.Store) {
		ctx := context.Background()
		e := newAttestEnv(t, open(t), []string{m.hash}, nil)
		type proved struct {
			a   *enroll.Attestation
			s   []byte
			ev  attestation.Evidence
			err error
		}
		// The TPM is one device: its commands run one at a time, as two
		// agents' would through the kernel's resource manager.
		var ps [2]proved
		for i := range ps {
			a, c, ak, csr, err := m.begin(t, e.svc, e.inst.ID)
			must(t, err)
			ps[i].a = a
			ps[i].s, ps[i].ev = proof(t, a, c, ak, csr)
		}
		done := make(chan error, len(ps))
		for i := range ps {
			go func() { _, err := e.svc.FinishAttested(ctx, ps[i].a, ps[i].s, ps[i].ev); done <- err }()
		}
		issued := 0
		for range ps {
			switch err := <-done; status.Code(fail.From(err)) {
			case codes.OK:
				issued++
			case codes.PermissionDenied, codes.FailedPrecondition, codes.AlreadyExists:
				t.Logf("refused: %v", err)
			default:
				t.Errorf("an answer that is neither a certificate nor a clear refusal: %v", err)
			}
		}
		if issued == 0 {
			t.Fatal("two genuine proofs of the node's TPM, and neither was issued a certificate")
		}
		cs, err := e.st.ListCertificates(ctx, store.CertificateFilter{InstanceID: e.inst.ID}, store.Page{Limit: 100})
		must(t, err)
		evs, err := e.st.ListEvents(ctx, store.EventFilter{Kind: events.EnrollSucceeded}, store.Page{Limit: 10})
		must(t, err)
		if len(cs) != issued || len(evs) != issued {
			t.Fatalf("%d issued, %d certificates recorded, %d enroll.succeeded events; want them equal", issued, len(cs), len(evs))
		}
	})
}

// TestTokenRefusedWhenAttestationRequired: a token for an instance whose
// node or template requires attestation is refused, with one event, and
// left unspent: once the requirement is lifted the same token enrolls.
func TestTokenRefusedWhenAttestationRequired(t *testing.T) {
	tests := []struct {
		name        string
		node, tpl   bool
		wantRefusal string
	}{
		{"node requires it", true, false, "its node requires TPM attestation"},
		{"template requires it", false, true, "its template requires TPM attestation"},
	}
	stores(t, func(t *testing.T, open func(t *testing.T) store.Store) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				ctx := context.Background()
				e := newAttestEnv(t, open(t), nil, nil)
				setRequire := func(on bool) {
					e.edge.RequireAttestation = tt.node && on
					must(t, e.st.Tx(ctx, func(q store.Queries) error { return q.UpdateNode(ctx, e.edge) }))
					tpl, err := e.st.GetTemplateByID(ctx, e.edge.TemplateID)
					must(t, err)
					tpl.RequireAttestation = tt.tpl && on
					must(t, e.st.UpdateTemplate(ctx, tpl))
				}
				setRequire(true)
				token, hash, err := pki.NewToken()
				must(t, err)
				now := e.clk.Now()
				must(t, e.st.CreateToken(ctx, &store.Token{Hash: hash, InstanceID: e.inst.ID, ExpiresAt: now.Add(time.Hour), CreatedAt: now}))
				_, csr := csrPEM(t)
				for range 2 {
					_, err = e.svc.Enroll(ctx, token, csr)
					st := status.Convert(fail.From(err))
					if st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), tt.wantRefusal) || !strings.Contains(st.Message(), "a token alone is refused") {
						t.Fatalf("Enroll = %v, want FailedPrecondition saying %q", err, tt.wantRefusal)
					}
				}
				if n := countEvents(t, e.st, events.EnrollRefused); n != 1 {
					t.Fatalf("%d enroll.refused events after two refusals, want 1", n)
				}
				setRequire(false)
				if _, err := e.svc.Enroll(ctx, token, csr); err != nil {
					t.Fatalf("the refused token was spent: %v", err)
				}
			})
		}
	})
}
