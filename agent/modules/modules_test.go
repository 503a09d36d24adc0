package modules

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherfleet/tether/agent/enroll"
	"github.com/tetherfleet/tether/agent/enroll/enrolltest"
	"github.com/tetherfleet/tether/pki"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// env is an enrolled node talking to a fake control plane.
type env struct {
	srv    *enrolltest.Server
	client tetherv1.AgentServiceClient
	dir    string
}

func newEnv(tb testing.TB, stateDir string, opts ...enrolltest.Option) *env {
	tb.Helper()
	ca := enrolltest.NewCA(tb, "ca")
	srv := enrolltest.Start(tb, ca, opts...)
	m, err := enroll.New(enroll.Config{StateDir: stateDir, URL: srv.URL, CAFingerprint: ca.Fingerprint})
	if err != nil {
		tb.Fatal(err)
	}
	ec, err := m.Dial(false)
	if err != nil {
		tb.Fatal(err)
	}
	defer ec.Close()
	if _, err := m.Enroll(context.Background(), tetherv1.NewEnrollmentServiceClient(ec), srv.AddToken("i-1")); err != nil {
		tb.Fatal(err)
	}
	conn, err := m.Dial(true)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	return &env{srv: srv, client: tetherv1.NewAgentServiceClient(conn), dir: filepath.Join(stateDir, "modules")}
}

func randomBytes(tb testing.TB, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		tb.Fatal(err)
	}
	return b
}

// addModule serves blob under its digest and returns the module record.
func (e *env) addModule(name string, blob []byte) *tetherv1.Module {
	d := enrolltest.Digest(blob)
	e.srv.Lock()
	e.srv.Blobs[d] = blob
	e.srv.Unlock()
	return &tetherv1.Module{Name: name, Version: "1", Digest: d, Size: int64(len(blob))}
}

func (e *env) offsets() []int64 {
	e.srv.Lock()
	defer e.srv.Unlock()
	return append([]int64(nil), e.srv.FetchOffsets...)
}

type recorder struct {
	mu    sync.Mutex
	progs []Progress
	logs  []string
}

func (r *recorder) progress(p Progress) { r.mu.Lock(); r.progs = append(r.progs, p); r.mu.Unlock() }
func (r *recorder) logf(f string, a ...any) {
	r.mu.Lock()
	r.logs = append(r.logs, strings.TrimSpace(fmt.Sprintf(f, a...)))
	r.mu.Unlock()
}

func (e *env) fetcher(t testing.TB, r *recorder) *Fetcher {
	f, err := New(Config{
		Dir:       e.dir,
		Client:    func() tetherv1.AgentServiceClient { return e.client },
		Progress:  r.progress,
		Logf:      r.logf,
		Delay:     func(int) time.Duration { return 0 },
		MaxStalls: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestFetchVerifiesAndCaches(t *testing.T) {
	e := newEnv(t, t.TempDir())
	blob := randomBytes(t, 3<<20+17)
	m := e.addModule("base", blob)
	r := &recorder{}
	f := e.fetcher(t, r)

	path, err := f.Fetch(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, blob) {
		t.Fatal("cached file differs from the module")
	}
	if filepath.Base(path) != strings.TrimPrefix(m.Digest, "sha256:") {
		t.Fatalf("path %s is not named by the digest", path)
	}
	if _, err := os.Stat(path + ".partial"); !os.IsNotExist(err) {
		t.Fatal("partial file left behind")
	}
	last := r.progs[len(r.progs)-1]
	if last.Done != int64(len(blob)) || last.Total != int64(len(blob)) || last.Module != "base:1" {
		t.Fatalf("last progress = %+v", last)
	}
	for i := 1; i < len(r.progs); i++ {
		if r.progs[i].Done < r.progs[i-1].Done {
			t.Fatal("progress went backwards")
		}
	}

	// Second fetch: from the cache, verified, no download.
	n := len(e.offsets())
	if _, err := f.Fetch(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	if len(e.offsets()) != n || !r.progs[len(r.progs)-1].Cached {
		t.Fatal("a verified cached module was downloaded again")
	}

	// A corrupted cache entry is noticed, discarded and downloaded again.
	corrupt := append([]byte(nil), blob...)
	corrupt[100] ^= 1
	if err := os.WriteFile(path, corrupt, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Fetch(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	if len(e.offsets()) != n+1 {
		t.Fatal("corrupt cache entry was not downloaded again")
	}
	if !strings.Contains(strings.Join(r.logs, "\n"), "failed verification") {
		t.Fatalf("no console line about the bad cache entry: %v", r.logs)
	}
}

func TestFetchResumesAfterCut(t *testing.T) {
	e := newEnv(t, t.TempDir())
	blob := randomBytes(t, 2<<20)
	m := e.addModule("base", blob)
	e.srv.Lock()
	e.srv.CutAfter = 700 << 10 // not a chunk multiple: cut mid-chunk
	e.srv.CutTimes = 2
	e.srv.Unlock()
	r := &recorder{}
	path, err := e.fetcher(t, r).Fetch(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	want := []int64{0, 700 << 10, 1400 << 10}
	if got := e.offsets(); len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("fetch offsets = %v, want %v", got, want)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, blob) {
		t.Fatal("resumed download differs from the module")
	}
	if r.progs[len(r.progs)-1].Resumed != 2 {
		t.Fatalf("progress says resumed %d times, want 2", r.progs[len(r.progs)-1].Resumed)
	}
	if !strings.Contains(strings.Join(r.logs, "\n"), "interrupted at 716800 of 2097152 bytes") {
		t.Fatalf("console lines: %v", r.logs)
	}
}

func TestFetchResumesPartialFromEarlierRun(t *testing.T) {
	e := newEnv(t, t.TempDir())
	blob := randomBytes(t, 1<<20)
	m := e.addModule("base", blob)
	f := e.fetcher(t, &recorder{})
	final, _ := f.Path(m.Digest)
	os.MkdirAll(e.dir, 0o700)
	if err := os.WriteFile(final+".partial", blob[:1000], 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Fetch(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	if got := e.offsets(); len(got) != 1 || got[0] != 1000 {
		t.Fatalf("offsets = %v, want [1000]", got)
	}
}

func TestFetchMismatchDiscards(t *testing.T) {
	tests := []struct {
		name  string
		setup func(e *env, m *tetherv1.Module, f *Fetcher)
	}{
		{"server serves other bytes", func(e *env, m *tetherv1.Module, _ *Fetcher) {
			e.srv.Lock()
			bad := append([]byte(nil), e.srv.Blobs[m.Digest]...)
			bad[len(bad)/2] ^= 0xff
			e.srv.Blobs[m.Digest] = bad
			e.srv.Unlock()
		}},
		{"stale partial holds other bytes", func(e *env, m *tetherv1.Module, f *Fetcher) {
			final, _ := f.Path(m.Digest)
			os.MkdirAll(e.dir, 0o700)
			os.WriteFile(final+".partial", []byte("not the module"), 0o600)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, t.TempDir())
			m := e.addModule("base", randomBytes(t, 300<<10))
			f := e.fetcher(t, &recorder{})
			tt.setup(e, m, f)
			_, err := f.Fetch(context.Background(), m)
			var dm *DigestMismatchError
			if !errors.As(err, &dm) {
				t.Fatalf("err = %v, want DigestMismatchError", err)
			}
			if dm.Module != "base:1" || dm.Want != m.Digest || !strings.HasPrefix(dm.Got, "sha256:") || dm.Got == dm.Want {
				t.Fatalf("mismatch = %+v", dm)
			}
			for _, want := range []string{"base:1", m.Digest, dm.Got} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
			entries, _ := os.ReadDir(e.dir)
			if len(entries) != 0 {
				t.Fatalf("cache holds %d files after a mismatch, want none", len(entries))
			}
		})
	}
}

func TestFetchPermanentErrors(t *testing.T) {
	e := newEnv(t, t.TempDir())
	blob := randomBytes(t, 1000)
	m := e.addModule("base", blob)
	f := e.fetcher(t, &recorder{})

	missing := &tetherv1.Module{Name: "ghost", Version: "1", Digest: enrolltest.Digest([]byte("x"))}
	if _, err := f.Fetch(context.Background(), missing); err == nil || !strings.Contains(err.Error(), "not assigned") {
		t.Fatalf("missing module: %v", err)
	}
	if n := len(e.offsets()); n != 1 {
		t.Fatalf("a NotFound was retried: %d calls", n)
	}

	wrongSize := &tetherv1.Module{Name: "base", Version: "1", Digest: m.Digest, Size: 999}
	if _, err := f.Fetch(context.Background(), wrongSize); err == nil || !strings.Contains(err.Error(), "assignment says 999") {
		t.Fatalf("size mismatch: %v", err)
	}

	if _, err := f.Fetch(context.Background(), &tetherv1.Module{Name: "x", Digest: "md5:abc"}); err == nil {
		t.Fatal("a malformed digest was accepted")
	}
}

func TestFetchGivesUpWithoutProgress(t *testing.T) {
	e := newEnv(t, t.TempDir())
	m := e.addModule("base", randomBytes(t, 1000))
	e.srv.Stop()
	_, err := e.fetcher(t, &recorder{}).Fetch(context.Background(), m)
	if err == nil || !strings.Contains(err.Error(), "no progress in 3 attempts") {
		t.Fatalf("err = %v", err)
	}
}

func TestVerifySignature(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	otherPub, otherPriv, _ := ed25519.GenerateKey(rand.Reader)
	digest := enrolltest.Digest([]byte("module"))
	sign := func(k ed25519.PrivateKey, name, version, d string) []byte {
		return ed25519.Sign(k, SignedMessage(name, version, d))
	}
	tests := []struct {
		name    string
		sig     []byte
		keys    [][]byte
		wantErr string
	}{
		{"good", sign(priv, "base", "1", digest), [][]byte{pub}, ""},
		{"good with the second key", sign(priv, "base", "1", digest), [][]byte{otherPub, pub}, ""},
		{"unsigned", nil, [][]byte{pub}, "unsigned"},
		{"other key", sign(otherPriv, "base", "1", digest), [][]byte{pub}, "does not verify"},
		{"signed over another version", sign(priv, "base", "2", digest), [][]byte{pub}, "does not verify"},
		{"signed over another digest", sign(priv, "base", "1", enrolltest.Digest([]byte("x"))), [][]byte{pub}, "does not verify"},
		{"no keys", sign(priv, "base", "1", digest), nil, "no signing keys"},
		{"malformed key", sign(priv, "base", "1", digest), [][]byte{pub[:31]}, "does not verify"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := &tetherv1.Module{Name: "base", Version: "1", Digest: digest, Signature: tt.sig}
			err := VerifySignature(m, tt.keys)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
		})
	}
	if got := string(SignedMessage("base", "1", digest)); got != "tether-module-v1\nbase\n1\n"+digest {
		t.Fatalf("signed message = %q", got)
	}
}

func TestCheckSignatures(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	otherPub, otherPriv, _ := ed25519.GenerateKey(rand.Reader)
	anchored, other := pki.SignerFingerprint(pub), pki.SignerFingerprint(otherPub)
	d := enrolltest.Digest([]byte("a"))
	sig := func(k ed25519.PrivateKey, kp ed25519.PublicKey, digest string) *tetherv1.ModuleSignature {
		return &tetherv1.ModuleSignature{Signer: pki.SignerFingerprint(kp), PublicKey: kp, Signature: pki.SignModule(k, "a", "1", digest)}
	}
	mod := func(sigs ...*tetherv1.ModuleSignature) *tetherv1.Module {
		return &tetherv1.Module{Name: "a", Version: "1", Digest: d, Signatures: sigs}
	}
	tests := []struct {
		name    string
		asg     *tetherv1.Assignment
		anchors []string
		wantErr string
	}{
		{"nothing required", &tetherv1.Assignment{RootModules: []*tetherv1.Module{mod()}}, nil, ""},
		{"anchored signer", &tetherv1.Assignment{RootModules: []*tetherv1.Module{mod(sig(priv, pub, d))}}, []string{anchored}, ""},
		{"anchored among others", &tetherv1.Assignment{RootModules: []*tetherv1.Module{mod(sig(otherPriv, otherPub, d), sig(priv, pub, d))}}, []string{anchored}, ""},
		{"unsigned with an anchor", &tetherv1.Assignment{RootModules: []*tetherv1.Module{mod()}}, []string{anchored}, "a:1 refused: node signer anchor: unsigned"},
		{"signer not anchored", &tetherv1.Assignment{RootModules: []*tetherv1.Module{mod(sig(otherPriv, otherPub, d))}}, []string{anchored}, "signed only by " + other},
		{"signature over another digest", &tetherv1.Assignment{RootModules: []*tetherv1.Module{mod(sig(priv, pub, enrolltest.Digest([]byte("b"))))}}, []string{anchored}, "does not verify over this module"},
		{"anchored key claimed for another key's signature", &tetherv1.Assignment{RootModules: []*tetherv1.Module{mod(&tetherv1.ModuleSignature{PublicKey: pub, Signature: pki.SignModule(otherPriv, "a", "1", d)})}}, []string{anchored}, "does not verify"},
		{"assignment drops every requirement", &tetherv1.Assignment{RootModules: []*tetherv1.Module{mod(sig(otherPriv, otherPub, d))}, RequireSignedModules: false, SigningKeys: [][]byte{otherPub}}, []string{anchored}, "node signer anchor"},
		{"assignment names another signer", &tetherv1.Assignment{RootModules: []*tetherv1.Module{mod(sig(otherPriv, otherPub, d))}, RequiredSigners: []string{other}}, []string{anchored}, "node signer anchor"},
		{"assignment adds a signer", &tetherv1.Assignment{RootModules: []*tetherv1.Module{mod(sig(priv, pub, d))}, RequiredSigners: []string{other}}, []string{anchored}, "template's required signers: signed only by " + anchored},
		{"extension checked too", &tetherv1.Assignment{RootModules: []*tetherv1.Module{mod(sig(priv, pub, d))}, ExtensionModules: []*tetherv1.Module{{Name: "ext", Version: "1", Digest: d}}}, []string{anchored}, "ext:1 refused"},
		{"legacy require signed, unsigned", &tetherv1.Assignment{RootModules: []*tetherv1.Module{mod()}, RequireSignedModules: true, SigningKeys: [][]byte{pub}}, nil, "a:1 refused: unsigned"},
		{"legacy require signed, signed", &tetherv1.Assignment{RootModules: []*tetherv1.Module{mod(sig(priv, pub, d))}, RequireSignedModules: true, SigningKeys: [][]byte{pub}}, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckSignatures(tt.asg, Policy{Anchors: tt.anchors})
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
			var ref *SignatureRefused
			if !errors.As(err, &ref) || !strings.HasPrefix(err.Error(), RefusedKind+": module ") {
				t.Fatalf("err = %v: want a SignatureRefused naming the module", err)
			}
		})
	}
}

// Chunks that are not a multiple of the HTTP/2 frame size, and a cut in the
// middle of one: every chunk is written at its offset from several receive
// buffers.
func TestFetchOddChunkSizes(t *testing.T) {
	for _, chunk := range []int{1, 16<<10 + 1, 300_001, 1<<20 + 7} {
		t.Run(fmt.Sprint(chunk), func(t *testing.T) {
			e := newEnv(t, t.TempDir())
			size := 3<<20 + 5
			if chunk == 1 {
				size = 5000
			}
			blob := randomBytes(t, size)
			m := e.addModule("base", blob)
			e.srv.Lock()
			e.srv.ChunkSize = chunk
			e.srv.CutAfter = int64(size/2 + 3)
			e.srv.CutTimes = 1
			e.srv.Unlock()
			path, err := e.fetcher(t, &recorder{}).Fetch(context.Background(), m)
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := os.ReadFile(path); !bytes.Equal(got, blob) {
				t.Fatal("cached file differs from the module")
			}
			if got := e.offsets(); len(got) != 2 || got[1] != int64(size/2+3) {
				t.Fatalf("offsets = %v", got)
			}
		})
	}
}

// A partial file longer than the module (left by another module's
// download under a colliding name, or garbage) cannot be a prefix of it:
// it is dropped and the module downloaded from the start.
func TestFetchDropsPartialLongerThanModule(t *testing.T) {
	e := newEnv(t, t.TempDir())
	blob := randomBytes(t, 1<<20)
	m := e.addModule("base", blob)
	f := e.fetcher(t, &recorder{})
	final, _ := f.Path(m.Digest)
	os.MkdirAll(e.dir, 0o700)
	if err := os.WriteFile(final+".partial", randomBytes(t, len(blob)+4096), 0o600); err != nil {
		t.Fatal(err)
	}
	path, err := f.Fetch(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, blob) {
		t.Fatal("cached file differs from the module")
	}
	if got := e.offsets(); len(got) != 1 || got[0] != 0 {
		t.Fatalf("offsets = %v, want [0]", got)
	}
}
