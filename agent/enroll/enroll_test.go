package enroll

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/agent/enroll/enrolltest"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// logs collects console lines.
type logs struct {
	mu    sync.Mutex
	lines []string
	ch    chan string
}

func newLogs() *logs { return &logs{ch: make(chan string, 1000)} }

func (l *logs) Logf(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	l.mu.Lock()
	l.lines = append(l.lines, s)
	l.mu.Unlock()
	select {
	case l.ch <- s:
	default:
	}
}

// waitFor returns the first line containing want.
func (l *logs) waitFor(t *testing.T, want string) string {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case s := <-l.ch:
			if strings.Contains(s, want) {
				return s
			}
		case <-deadline:
			l.mu.Lock()
			defer l.mu.Unlock()
			t.Fatalf("no console line containing %q; got:\n%s", want, strings.Join(l.lines, "\n"))
		}
	}
}

type fixture struct {
	ca    *enrolltest.CA
	srv   *enrolltest.Server
	clock *fakeClock
	logs  *logs
	dir   string
}

func newFixture(t *testing.T, opts ...enrolltest.Option) *fixture {
	ca := enrolltest.NewCA(t, "tether test CA")
	srv := enrolltest.Start(t, ca, opts...)
	f := &fixture{ca: ca, srv: srv, clock: newFakeClock(time.Now()), logs: newLogs(), dir: filepath.Join(t.TempDir(), "state")}
	srv.Lock()
	srv.Now = f.clock.Now
	srv.Unlock()
	return f
}

func (f *fixture) manager(t *testing.T, pin string) *Manager {
	t.Helper()
	m, err := New(Config{
		StateDir: f.dir, URL: f.srv.URL, CAFingerprint: pin, Clock: f.clock, Logf: f.logs.Logf,
		Delay: func(int) time.Duration { return time.Second },
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func enroll(t *testing.T, m *Manager, token string) (*Identity, error) {
	t.Helper()
	conn, err := m.Dial(false)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return m.Enroll(ctx, tetherv1.NewEnrollmentServiceClient(conn), token)
}

func agentClient(t *testing.T, m *Manager) tetherv1.AgentServiceClient {
	t.Helper()
	conn, err := m.Dial(true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return tetherv1.NewAgentServiceClient(conn)
}

func TestEnrollStoresIdentity(t *testing.T) {
	f := newFixture(t)
	m := f.manager(t, f.ca.Fingerprint)
	tok := f.srv.AddToken("i-123")
	id, err := enroll(t, m, tok)
	if err != nil {
		t.Fatal(err)
	}
	if id.InstanceID != "i-123" || m.Current() != id {
		t.Fatalf("identity = %+v", id)
	}
	if !m.TokenSpent(tok) {
		t.Error("TokenSpent = false for the token just used")
	}
	if m.TokenSpent(f.srv.AddToken("i-123")) {
		t.Error("TokenSpent = true for a fresh token")
	}
	st, err := os.Stat(f.dir)
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("state dir mode = %v, %v; want 0700", st.Mode().Perm(), err)
	}
	for _, name := range []string{KeyFile, CertFile, CAFile, IdentityFile} {
		st, err := os.Stat(filepath.Join(f.dir, name))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, %v; want 0600", name, st.Mode().Perm(), err)
		}
	}
	// The agent after the switch of root loads the same identity and uses it.
	m2 := f.manager(t, f.ca.Fingerprint)
	loaded, err := m2.Load()
	if err != nil {
		t.Fatal(err)
	}
	if loaded.InstanceID != "i-123" || !loaded.Cert.Equal(id.Cert) || !loaded.Key.Equal(id.Key) {
		t.Fatalf("loaded identity differs")
	}
	a, err := agentClient(t, m2).GetAssignment(context.Background(), &tetherv1.GetAssignmentRequest{})
	if err != nil || a.GetInstanceId() != "i-123" {
		t.Fatalf("GetAssignment with the loaded identity: %v, %v", a, err)
	}
	// A different pin does not reuse the identity.
	other := enrolltest.NewCA(t, "other")
	if _, err := f.manager(t, other.Fingerprint).Load(); !errors.Is(err, ErrNoIdentity) {
		t.Fatalf("Load under another pin = %v, want ErrNoIdentity", err)
	}
}

func TestEnrollRefusedToken(t *testing.T) {
	f := newFixture(t)
	m := f.manager(t, f.ca.Fingerprint)
	_, err := enroll(t, m, "tbt_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
	if status.Code(errors.Unwrap(err)) != codes.Unauthenticated {
		t.Fatalf("err = %v, want Unauthenticated", err)
	}
	if m.Current() != nil {
		t.Fatal("identity set after a refused enrollment")
	}
}

func TestPinnedTLS(t *testing.T) {
	impostor := enrolltest.NewCA(t, "impostor CA")
	tests := []struct {
		name     string
		opts     []enrolltest.Option
		pinOther bool // pin a CA the server does not use
		wantPin  bool // a *PinMismatchError
		wantErr  string
	}{
		{name: "right pin accepted"},
		{name: "wrong pin refused", pinOther: true, wantPin: true},
		{name: "impostor server refused", opts: []enrolltest.Option{enrolltest.WithServerCA(impostor)}, wantPin: true},
		{name: "name mismatch refused", opts: []enrolltest.Option{enrolltest.WithServerNames("cp.example")}, wantErr: "does not verify"},
		{name: "leaf only without a saved CA refused", opts: []enrolltest.Option{enrolltest.WithLeafOnly()}, wantPin: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, tt.opts...)
			pin := f.ca.Fingerprint
			if tt.pinOther {
				pin = impostor.Fingerprint
			}
			m := f.manager(t, pin)
			_, err := enroll(t, m, f.srv.AddToken("i-1"))
			switch {
			case tt.wantPin:
				var pm *PinMismatchError
				if !errors.As(err, &pm) {
					t.Fatalf("err = %v, want a PinMismatchError", err)
				}
				if pm.Expected != pin || len(pm.Seen) == 0 {
					t.Fatalf("mismatch = %+v", pm)
				}
				msg := pm.Error()
				for _, want := range []string{"expected " + pin, "sha256sum", "re-provision"} {
					if !strings.Contains(msg, want) {
						t.Errorf("message %q lacks %q", msg, want)
					}
				}
			case tt.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
			default:
				if err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func TestPinMismatchNamesWhatWasSeen(t *testing.T) {
	f := newFixture(t)
	other := enrolltest.NewCA(t, "other")
	_, err := enroll(t, f.manager(t, other.Fingerprint), f.srv.AddToken("i-1"))
	var pm *PinMismatchError
	if !errors.As(err, &pm) {
		t.Fatalf("err = %v", err)
	}
	if !strings.Contains(strings.Join(pm.Seen, " "), f.ca.Fingerprint) {
		t.Fatalf("seen %v does not include the server's CA %s", pm.Seen, f.ca.Fingerprint)
	}
}

func TestLeafOnlyServerAcceptedWithSavedCA(t *testing.T) {
	ca := enrolltest.NewCA(t, "ca")
	full := enrolltest.Start(t, ca)
	leafOnly := enrolltest.Start(t, ca, enrolltest.WithLeafOnly())
	dir := t.TempDir()
	m, _ := New(Config{StateDir: dir, URL: full.URL, CAFingerprint: ca.Fingerprint})
	if _, err := enroll(t, m, full.AddToken("i-1")); err != nil {
		t.Fatal(err)
	}
	m2, _ := New(Config{StateDir: dir, URL: leafOnly.URL, CAFingerprint: ca.Fingerprint})
	if _, err := m2.Load(); err != nil {
		t.Fatal(err)
	}
	if _, err := agentClient(t, m2).GetAssignment(context.Background(), &tetherv1.GetAssignmentRequest{}); err != nil {
		t.Fatalf("leaf-only server with the saved CA: %v", err)
	}
}

func TestRenewSwapsKeyAndCertificate(t *testing.T) {
	f := newFixture(t)
	m := f.manager(t, f.ca.Fingerprint)
	old, err := enroll(t, m, f.srv.AddToken("i-7"))
	if err != nil {
		t.Fatal(err)
	}
	changed := m.Subscribe()
	tlsCfg := m.TLSConfig()
	renewed, err := m.Renew(context.Background(), agentClient(t, m))
	if err != nil {
		t.Fatal(err)
	}
	if renewed.Key.Equal(old.Key) || renewed.Cert.Equal(old.Cert) || renewed.InstanceID != "i-7" {
		t.Fatal("renewal did not produce a fresh key and certificate for the same instance")
	}
	select {
	case <-changed:
	default:
		t.Fatal("subscribers not told about the renewal")
	}
	c, err := tlsCfg.GetClientCertificate(nil)
	if err != nil || c.Leaf != renewed.Cert {
		t.Fatal("TLS config still hands out the old certificate")
	}
	m2 := f.manager(t, f.ca.Fingerprint)
	if loaded, err := m2.Load(); err != nil || !loaded.Cert.Equal(renewed.Cert) {
		t.Fatalf("stored certificate is not the renewed one: %v", err)
	}
}

func TestMaintainRenewsAtTwoThirds(t *testing.T) {
	f := newFixture(t)
	f.srv.Lock()
	f.srv.Lifetime = 3 * time.Hour
	f.srv.Unlock()
	m := f.manager(t, f.ca.Fingerprint)
	id, err := enroll(t, m, f.srv.AddToken("i-2"))
	if err != nil {
		t.Fatal(err)
	}
	client := agentClient(t, m)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Maintain(ctx, func() tetherv1.AgentServiceClient { return client }, Recovery{}) }()

	wait := f.clock.nextWait(t)
	want := id.RenewAt().Sub(f.clock.Now())
	if wait != want {
		t.Fatalf("Maintain waits %v, want %v (two thirds into the lifetime)", wait, want)
	}
	life := id.Cert.NotAfter.Sub(id.Cert.NotBefore)
	if got := id.RenewAt().Sub(id.Cert.NotBefore); got != life*2/3 {
		t.Fatalf("RenewAt is %v into a %v lifetime", got, life)
	}
	f.clock.Advance(wait)
	f.logs.waitFor(t, "certificate renewed")
	f.srv.Lock()
	n := f.srv.Renewals
	f.srv.Unlock()
	if n != 1 {
		t.Fatalf("renewals = %d, want 1", n)
	}
	// The next wait is for the new certificate.
	next := f.clock.nextWait(t)
	if cur := m.Current(); cur == id || next != cur.RenewAt().Sub(f.clock.Now()) {
		t.Fatalf("after renewal Maintain waits %v", next)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Maintain returned %v", err)
	}
}

func TestMaintainRetriesFailedRenewal(t *testing.T) {
	f := newFixture(t)
	m := f.manager(t, f.ca.Fingerprint)
	id, err := enroll(t, m, f.srv.AddToken("i-3"))
	if err != nil {
		t.Fatal(err)
	}
	f.srv.Lock()
	f.srv.RenewErr = status.Error(codes.Unavailable, "store is down")
	f.srv.Unlock()
	client := agentClient(t, m)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go m.Maintain(ctx, func() tetherv1.AgentServiceClient { return client }, Recovery{})
	f.clock.Advance(f.clock.nextWait(t))
	line := f.logs.waitFor(t, "certificate renewal failed")
	for _, want := range []string{"store is down", "retrying in 1s", "valid until " + stamp(id.Cert.NotAfter)} {
		if !strings.Contains(line, want) {
			t.Errorf("line %q lacks %q", line, want)
		}
	}
	f.srv.Lock()
	f.srv.RenewErr = nil
	f.srv.Unlock()
	f.clock.Advance(f.clock.nextWait(t))
	f.logs.waitFor(t, "certificate renewed")
}

func TestExpiredReenrollsWithUnusedToken(t *testing.T) {
	f := newFixture(t)
	m := f.manager(t, f.ca.Fingerprint)
	first := f.srv.AddToken("i-4")
	if _, err := enroll(t, m, first); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(25 * time.Hour)
	fresh := f.srv.AddToken("i-4")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := m.Recover(ctx, nil, Recovery{Tokens: func(context.Context) (string, error) { return fresh, nil }})
	if err != nil {
		t.Fatal(err)
	}
	f.logs.waitFor(t, "expired at")
	f.logs.waitFor(t, "re-enrolled as instance i-4")
	if m.Current().Expired(f.clock.Now()) {
		t.Fatal("still expired after re-enrollment")
	}
}

func TestExpiredWithoutTokenKeepsRetrying(t *testing.T) {
	f := newFixture(t)
	m := f.manager(t, f.ca.Fingerprint)
	spent := f.srv.AddToken("i-5")
	if _, err := enroll(t, m, spent); err != nil {
		t.Fatal(err)
	}
	client := agentClient(t, m)
	f.clock.Advance(25 * time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	go f.clock.AutoAdvance(ctx) // the retry back-offs pass at once
	done := make(chan error, 1)
	go func() {
		done <- m.Recover(ctx, func() tetherv1.AgentServiceClient { return client },
			Recovery{Tokens: func(context.Context) (string, error) { return spent, nil }})
	}()
	for i := 0; i < 3; i++ {
		line := f.logs.waitFor(t, "retrying in")
		for _, want := range []string{"expired at", "was spent", "tetherctl token create --instance i-5"} {
			if !strings.Contains(line, want) {
				t.Fatalf("attempt %d: line %q lacks %q", i, line, want)
			}
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Recover = %v", err)
	}
	f.srv.Lock()
	defer f.srv.Unlock()
	if f.srv.Renewals != 0 || f.srv.Enrollments != 1 {
		t.Fatalf("renewals=%d enrollments=%d; an expired certificate must not renew and a spent token must not be reused", f.srv.Renewals, f.srv.Enrollments)
	}
}

// A corrupt identity.json used to reset the record of spent tokens
// without a word. It is now said on the console, and the file is kept.
func TestCorruptMetadataIsReported(t *testing.T) {
	f := newFixture(t)
	m := f.manager(t, f.ca.Fingerprint)
	tok := f.srv.AddToken("i-123")
	if _, err := enroll(t, m, tok); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(f.dir, IdentityFile)
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if m.TokenSpent(tok) {
		t.Fatal("a corrupt record cannot know the token was spent")
	}
	f.logs.waitFor(t, "spent bootstrap tokens is lost")
	if b, err := os.ReadFile(path + ".corrupt"); err != nil || string(b) != "{not json" {
		t.Fatalf("the corrupt file was not kept: %q, %v", b, err)
	}
	// The next enrollment starts a fresh record, with its own token in it.
	tok2 := f.srv.AddToken("i-123")
	if _, err := enroll(t, m, tok2); err != nil {
		t.Fatal(err)
	}
	if !m.TokenSpent(tok2) {
		t.Fatal("the new record lacks the token just used")
	}
}

// brokenTPM is a TPM whose endorsement key cannot be read; it counts
// how often it was closed.
type brokenTPM struct {
	mu     sync.Mutex
	closed int
}

func (b *brokenTPM) Endorsement() ([]byte, []byte, error) {
	return nil, nil, errors.New("TPM2_ReadPublic: TPM_RC_HANDLE")
}
func (b *brokenTPM) NewKey() (AttestationKey, error) { return nil, errors.New("not reached") }
func (b *brokenTPM) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed++
	return nil
}

// TestExpiredTriesTheTPM: with no unspent token, recovery asks the TPM
// each attempt, says why it failed (no TPM, a TPM that cannot be read),
// closes what it opened, and keeps trying. The success, against a real
// control plane and swtpm, is TestReattestAfterPartition in
// controlplane/api.
func TestExpiredTriesTheTPM(t *testing.T) {
	broken := &brokenTPM{}
	tests := []struct {
		name string
		open func() (AttesterCloser, error)
		say  string
	}{
		{"no TPM", func() (AttesterCloser, error) { return nil, errors.New("no TPM at /dev/tpmrm0") }, "open the TPM: no TPM at /dev/tpmrm0"},
		{"a TPM that cannot be read", func() (AttesterCloser, error) { return broken, nil }, "TPM_RC_HANDLE"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			m := f.manager(t, f.ca.Fingerprint)
			inst := fmt.Sprintf("i-tpm-%d", i)
			if _, err := enroll(t, m, f.srv.AddToken(inst)); err != nil {
				t.Fatal(err)
			}
			f.clock.Advance(25 * time.Hour)
			ctx, cancel := context.WithCancel(context.Background())
			go f.clock.AutoAdvance(ctx)
			var opened int
			var mu sync.Mutex
			done := make(chan error, 1)
			go func() {
				done <- m.Recover(ctx, nil, Recovery{OpenTPM: func() (AttesterCloser, error) {
					mu.Lock()
					opened++
					mu.Unlock()
					return tt.open()
				}})
			}()
			for range 2 {
				line := f.logs.waitFor(t, "retrying in")
				for _, want := range []string{"no bootstrap token was found", "re-enrolling by TPM attestation failed", tt.say, "tetherctl node update NODE --ek HASH"} {
					if !strings.Contains(line, want) {
						t.Fatalf("line %q lacks %q", line, want)
					}
				}
			}
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Fatalf("Recover = %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			if opened < 2 {
				t.Fatalf("the TPM was asked %d times in two attempts", opened)
			}
			if !m.Current().Expired(f.clock.Now()) {
				t.Fatal("a failed recovery replaced the certificate")
			}
		})
	}
	broken.mu.Lock()
	defer broken.mu.Unlock()
	if broken.closed < 2 {
		t.Fatalf("the opened TPM was closed %d times after two attempts", broken.closed)
	}
}

// cutOnce loses its first Enroll call, as a connection cut before the
// answer arrived does, and records every CSR it is sent.
type cutOnce struct {
	tetherv1.EnrollmentServiceClient
	csrs []string
}

func (c *cutOnce) Enroll(ctx context.Context, in *tetherv1.EnrollRequest, opts ...grpc.CallOption) (*tetherv1.EnrollResponse, error) {
	c.csrs = append(c.csrs, in.GetCsrPem())
	if len(c.csrs) == 1 {
		return nil, status.Error(codes.Unavailable, "error reading from server: EOF")
	}
	return c.EnrollmentServiceClient.Enroll(ctx, in, opts...)
}

// A retried enrollment sends the same CSR (the control plane answers a
// spent token again only for the key it was spent for); the next token
// gets a fresh key.
func TestEnrollRetrySendsTheSameKey(t *testing.T) {
	f := newFixture(t)
	m := f.manager(t, f.ca.Fingerprint)
	conn, err := m.Dial(false)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := &cutOnce{EnrollmentServiceClient: tetherv1.NewEnrollmentServiceClient(conn)}
	ctx := context.Background()
	tok := f.srv.AddToken("i-1")
	if _, err := m.Enroll(ctx, client, tok); status.Code(err) != codes.Unavailable {
		t.Fatalf("first attempt: %v, want the cut", err)
	}
	id, err := m.Enroll(ctx, client, tok)
	if err != nil {
		t.Fatal(err)
	}
	if len(client.csrs) != 2 || client.csrs[0] != client.csrs[1] {
		t.Fatalf("the retry sent another CSR")
	}
	next, err := m.Enroll(ctx, client, f.srv.AddToken("i-1"))
	if err != nil {
		t.Fatal(err)
	}
	if client.csrs[2] == client.csrs[1] || next.Key.Equal(id.Key) {
		t.Fatal("a new token reused the previous enrollment's key")
	}
}
