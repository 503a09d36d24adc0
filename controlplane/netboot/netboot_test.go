package netboot_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/netboot"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/pki"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/external"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type fixture struct {
	ctx    context.Context
	st     store.Store
	svc    *instances.Service
	srv    *httptest.Server
	logs   *lockedBuffer
	module string // a module's digest: a blob that is not a boot artifact
}

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func setup(t testing.TB) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	dir := t.TempDir()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "t.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	blobs, err := modules.OpenBlobs(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	ingest := func(s string) string {
		d, _, err := blobs.Ingest(strings.NewReader(s), false)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	clk := clock.NewFake(t0)
	logs := &lockedBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	svc := &instances.Service{Store: st, Clock: clk, Log: log,
		Machines:  map[string]providers.Provider{external.Name: external.New()},
		Artifacts: &instances.Artifacts{Blobs: blobs, Kernel: ingest("kernel bytes"), Initramfs: ingest("initramfs bytes"), BaseURL: "http://10.0.2.2:8080"},
		AgentURL:  "https://10.0.2.2:7443", CAFingerprint: "sha256:" + strings.Repeat("cd", 32)}
	tpl := &store.Template{Name: "tpl", KernelArgs: "console=ttyS0\nchain http://evil", CreatedAt: t0, UpdatedAt: t0}
	if err := st.CreateTemplate(ctx, tpl); err != nil {
		t.Fatal(err)
	}
	node := &store.Node{Name: "n", TemplateID: tpl.ID, Enabled: true, Config: []byte("{}"), CreatedAt: t0, UpdatedAt: t0}
	if err := st.CreateNode(ctx, node); err != nil {
		t.Fatal(err)
	}
	nb := &netboot.Server{Store: st, Clock: clk, Log: log, Instances: svc}
	srv := httptest.NewServer(nb.Handler())
	t.Cleanup(srv.Close)
	return &fixture{ctx: ctx, st: st, svc: svc, srv: srv, logs: logs, module: ingest("an erofs module, say")}
}

func (f *fixture) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(f.srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (f *fixture) provision(t testing.TB) *store.Instance {
	t.Helper()
	res, err := f.svc.Provision(f.ctx, instances.ProvisionParams{Node: "n", Provider: external.Name})
	if err != nil {
		t.Fatal(err)
	}
	return res.Instance
}

func TestScriptIsServedOncePerBoot(t *testing.T) {
	f := setup(t)
	in := f.provision(t)
	code, body := f.get(t, netboot.ScriptPath(in.ID))
	if code != http.StatusOK || !strings.HasPrefix(body, "#!ipxe\n") {
		t.Fatalf("%d %q", code, body)
	}
	for _, want := range []string{
		"kernel http://10.0.2.2:8080/artifacts/" + f.svc.Artifacts.Kernel + " initrd=initramfs console=ttyS0 chain http://evil",
		"tether.url=https://10.0.2.2:7443", "tether.ca=" + f.svc.CAFingerprint,
		"initrd --name initramfs http://10.0.2.2:8080/artifacts/" + f.svc.Artifacts.Initramfs, "\nboot\n",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("script lacks %q:\n%s", want, body)
		}
	}
	if n := strings.Count(body, "\n"); n != 4 {
		t.Fatalf("a template argument broke the script into %d lines:\n%s", n, body)
	}
	i := strings.Index(body, "tether.token=")
	token := strings.Fields(body[i+len("tether.token="):])[0]
	if tok, err := f.st.GetToken(f.ctx, pki.HashToken(token)); err != nil || tok.InstanceID != in.ID || tok.UsedAt != nil {
		t.Fatalf("served token: %+v %v", tok, err)
	}

	// A second fetch in the same boot is refused and leaves a trail.
	code, body = f.get(t, netboot.ScriptPath(in.ID))
	if code != http.StatusGone || strings.Contains(body, "tbt_") {
		t.Fatalf("second fetch: %d %q", code, body)
	}
	evs, _ := f.st.ListEvents(f.ctx, store.EventFilter{InstanceID: in.ID, Kind: events.NetbootRefused}, store.Page{Limit: 10})
	if len(evs) != 1 {
		t.Fatalf("%d refusal events", len(evs))
	}
	if logs := f.logs.String(); strings.Contains(logs, token) || strings.Contains(logs, "tbt_") {
		t.Fatalf("a token reached the log:\n%s", logs)
	}

	// The next boot (a transition) gets a fresh script once more.
	if err := f.svc.AgentReady(f.ctx, in.ID); err != nil {
		t.Fatal(err)
	}
	if code, _ := f.get(t, netboot.ScriptPath(in.ID)); code != http.StatusConflict {
		t.Fatalf("a running instance's script: %d", code)
	}
	cur, _ := f.st.GetInstance(f.ctx, in.ID)
	if err := f.st.Tx(f.ctx, func(q store.Queries) error {
		cur.Status = string(lifecycle.Running)
		return f.svc.TransitionTx(f.ctx, q, cur, lifecycle.Reboot, "test", t0)
	}); err != nil {
		t.Fatal(err)
	}
	code, body = f.get(t, netboot.ScriptPath(in.ID))
	if code != http.StatusOK || strings.Contains(body, token) {
		t.Fatalf("next boot: %d, same token reused: %v", code, strings.Contains(body, token))
	}
	if logs := f.logs.String(); strings.Contains(logs, "tbt_") {
		t.Fatalf("a token reached the log:\n%s", logs)
	}
}

func TestScriptRefusals(t *testing.T) {
	f := setup(t)
	for _, tc := range []struct {
		path string
		code int
	}{
		{netboot.ScriptPath("no-such-instance"), http.StatusNotFound},
		{"/ipxe/..%2f..%2fetc", http.StatusBadRequest},
		{"/ipxe/" + strings.Repeat("a", 65), http.StatusBadRequest},
	} {
		if code, _ := f.get(t, tc.path); code != tc.code {
			t.Errorf("%s: %d, want %d", tc.path, code, tc.code)
		}
	}
	in := f.provision(t)
	if _, err := f.svc.Terminate(f.ctx, in.ID); err != nil {
		t.Fatal(err)
	}
	if code, _ := f.get(t, netboot.ScriptPath(in.ID)); code != http.StatusConflict {
		t.Fatalf("a terminated instance's script: %d", code)
	}
}

func TestArtifacts(t *testing.T) {
	f := setup(t)
	code, body := f.get(t, "/artifacts/"+f.svc.Artifacts.Kernel)
	if code != http.StatusOK || body != "kernel bytes" {
		t.Fatalf("kernel: %d %q", code, body)
	}
	// Modules are for enrolled agents over mTLS, never served here.
	if code, _ := f.get(t, "/artifacts/"+f.module); code != http.StatusNotFound {
		t.Fatalf("a module blob was served: %d", code)
	}
	if code, _ := f.get(t, "/artifacts/sha256:nothex"); code != http.StatusBadRequest {
		t.Fatalf("bad digest: %d", code)
	}
	// A template's own kernel is an artifact too.
	tpl, _ := f.st.GetTemplate(f.ctx, "tpl")
	tpl.KernelDigest = f.module
	if err := f.st.UpdateTemplate(f.ctx, tpl); err != nil {
		t.Fatal(err)
	}
	if code, _ := f.get(t, "/artifacts/"+f.module); code != http.StatusOK {
		t.Fatalf("a template's kernel: %d", code)
	}
}
