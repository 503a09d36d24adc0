package dashboard

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/fake"
)

// chromiumPath finds Debian's chromium, or says loudly why the real-browser
// tests cannot run.
func chromiumPath(t testing.TB) string {
	t.Helper()
	for _, name := range []string{os.Getenv("TETHER_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"} {
		if name == "" {
			continue
		}
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("SKIP (missing chromium): the real-browser dashboard tests need Debian's chromium package (apt-get install chromium) or TETHER_CHROMIUM=/path")
	return ""
}

// browser starts headless Chromium for one test.
func browser(t testing.TB) context.Context {
	t.Helper()
	path := chromiumPath(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 1000), chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, cancelB := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	t.Cleanup(func() { cancelB(); cancelA() })
	// Start the browser now, so a broken install fails here with its reason.
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start chromium %s: %v", path, err)
	}
	return bctx
}

// run runs browser steps with a deadline, failing the test on error.
func run(t testing.TB, bctx context.Context, d time.Duration, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(bctx, d)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("browser: %v\npage:\n%s", err, pageText(bctx))
	}
}

// pageText is what the page says, for a failure's message.
func pageText(bctx context.Context) string {
	ctx, cancel := context.WithTimeout(bctx, 5*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`location.href + "\n" + document.body.innerText`))
	if err != nil {
		return "(unreadable: " + err.Error() + ")"
	}
	return s
}

// value runs one browser action that returns a value.
func value[T any](t testing.TB, bctx context.Context, d time.Duration, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(bctx, d)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	return v
}

// until polls a JavaScript predicate until it holds.
func until(expr string) chromedp.Action[chromedp.Void] {
	return void(chromedp.Poll[bool](expr, chromedp.WithPollingInterval(50*time.Millisecond)))
}

// eventually polls a predicate across a navigation the last step started:
// a poll that the navigation cuts is simply asked again.
func eventually(t testing.TB, bctx context.Context, d time.Duration, expr string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(bctx, time.Until(deadline))
		err := chromedp.Do(ctx, until(expr))
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("browser: %s did not hold within %s: %v\npage:\n%s", expr, d, err, pageText(bctx))
		}
	}
}

func void[T any](a chromedp.Action[T]) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := a(ctx, t)
		return chromedp.Void{}, err
	}
}

// shot saves a PNG screenshot (quality 100 means PNG; less is JPEG) to $TETHER_SCREENSHOTS (make screenshots points
// it at docs/screenshots) or to the test's temp dir.
func shot(t testing.TB, bctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("TETHER_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	}
	buf := value(t, bctx, 30*time.Second, chromedp.FullScreenshot(100))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), buf, 0o644); err != nil {
		t.Fatal(err)
	}
}

// agents boots a real agent (root mode none) for every machine the fake
// provider creates, as a machine would after its firmware handed it the
// enrollment data. Pool members so reach ready on their own.
type agents struct {
	cp   *testcp.ControlPlane
	prov *fake.Provider
	mu   sync.Mutex
	seen map[string]bool
}

func (a *agents) loop(t testing.TB, ctx context.Context) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, m := range a.prov.Machines() {
			a.mu.Lock()
			seen := a.seen[m.ID]
			a.seen[m.ID] = true
			a.mu.Unlock()
			if seen || m.State != providers.StateRunning {
				continue
			}
			enr, ok := a.prov.Enrollment(m.ID)
			if !ok || enr.Token == "" {
				continue
			}
			dir := filepath.Join(os.TempDir(), "tether-dash-agent-"+m.ID)
			go func() {
				defer os.RemoveAll(dir)
				err := agent.Run(ctx, agent.Config{ControlPlane: "https://" + a.cp.Addr, Token: enr.Token, CASHA256: a.cp.Fingerprint(),
					StateDir: dir, RootMode: agent.RootModeNone, Console: discard{}, Version: "dash"})
				if err != nil && ctx.Err() == nil && !errors.Is(err, context.Canceled) {
					t.Logf("agent for %s: %v", m.ID, err)
				}
			}()
		}
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func fakeFleet(t *testing.T, role string) (*harness, *fake.Provider) {
	prov := fake.New()
	// The fake provider boots nothing, but provisioning wants netboot
	// artifacts to hand it; any file will do.
	art := filepath.Join(t.TempDir(), "artifact")
	if err := os.WriteFile(art, []byte("not a kernel"), 0o644); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, role, testcp.With(func(o *daemon.ServeOptions) {
		o.Test.Providers = append(o.Test.Providers, prov)
		o.Kernel, o.Initramfs = art, art
	}))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	a := &agents{cp: h.cp, prov: prov, seen: map[string]bool{}}
	go a.loop(t, ctx)
	return h, prov
}

func TestBrowserFleetAndPools(t *testing.T) {
	bctx := browser(t)
	h, _ := fakeFleet(t, "admin")
	ctx := context.Background()
	fleet := h.cp.SeedFleet(ctx, "edge")

	// The fleet page opens and shows live status.
	run(t, bctx, 30*time.Second, chromedp.Navigate(h.ts.URL+h.srv.Path("/")),
		chromedp.WaitVisible(`[data-count="total"]`), chromedp.WaitVisible(`#live-status.live-on`),
		void(chromedp.Evaluate[int](`window.__noReload = 1`)))

	// A pool created now reaches its target on the open page, with no reload.
	if _, err := h.cp.Admin.CreatePool(ctx, &v1.CreatePoolRequest{Name: "web", Template: fleet.Template, Provider: "fake", TargetSize: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.cp.Admin.ReplenishPool(ctx, &v1.PoolActionRequest{Name: "web"}); err != nil {
		t.Fatal(err)
	}
	run(t, bctx, 90*time.Second,
		until(`(() => { const r = document.querySelector('tr[data-pool="web"]'); return !!r && r.textContent.includes("2 ready"); })()`))
	if !value(t, bctx, 10*time.Second, chromedp.Evaluate[bool](`window.__noReload === 1`)) {
		t.Fatal("the fleet page reloaded instead of updating live")
	}
	shot(t, bctx, "fleet")
	run(t, bctx, 30*time.Second, chromedp.Navigate(h.ts.URL+h.srv.Path("/instances")), chromedp.WaitVisible(`table.rows`))
	shot(t, bctx, "instances")

	// Acquire from the pool page: confirm, then the server's answer.
	run(t, bctx, 30*time.Second, chromedp.Navigate(h.ts.URL+h.srv.Path("/pools/web")),
		chromedp.WaitVisible(`svg.chart`))
	shot(t, bctx, "pool")
	run(t, bctx, 30*time.Second,
		chromedp.Click(`a[data-action="acquire"]`, chromedp.NodeVisible),
		chromedp.WaitVisible(`#confirm`),
		chromedp.SendKeys(`input[name="by"]`, "ci-runner-7"),
		chromedp.SendKeys(`input[name="for"]`, "job 4411"),
		chromedp.Click(`#confirm`, chromedp.NodeVisible),
		chromedp.WaitVisible(`#result`))
	code := value(t, bctx, 10*time.Second, chromedp.Text(`#code`))
	body := value(t, bctx, 10*time.Second, chromedp.Text(`#body`))
	if code != "OK" || !strings.Contains(body, `"claim_id"`) {
		t.Fatalf("acquire answer %q:\n%s", code, body)
	}
	resp, err := h.cp.Admin.ListInstances(ctx, &v1.ListInstancesRequest{PageSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	var claimed *v1.Instance
	for _, in := range resp.Instances {
		if in.PoolState == v1.PoolState_POOL_STATE_CLAIMED {
			claimed = in
		}
	}
	if claimed == nil || !strings.Contains(body, claimed.ClaimId) {
		t.Fatalf("no claimed member in the store matching the page's answer:\n%s", body)
	}
	evs, err := h.cp.Admin.ListEvents(ctx, &v1.ListEventsRequest{Kind: "pool.claimed", PageSize: 10})
	if err != nil || len(evs.Events) != 1 || payloadString(evs.Events[0], "acquired_by") != "ci-runner-7" {
		t.Fatalf("pool.claimed events %v %v", evs, err)
	}

	// Terminate the claimed instance with confirmation.
	run(t, bctx, 30*time.Second, chromedp.Navigate(h.ts.URL+h.srv.Path("/instances/"+claimed.Id)),
		chromedp.WaitVisible(`svg.timeline`))
	shot(t, bctx, "instance")
	run(t, bctx, 30*time.Second,
		chromedp.Click(`a[data-action="terminate"]`, chromedp.NodeVisible),
		chromedp.WaitVisible(`#confirm`),
		chromedp.Click(`#confirm`, chromedp.NodeVisible),
		chromedp.WaitVisible(`#result`))
	code = value(t, bctx, 10*time.Second, chromedp.Text(`#code`))
	if code != "OK" {
		t.Fatalf("terminate answer %q", code)
	}
	got, err := h.cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: claimed.Id})
	if err != nil || got.Status != v1.InstanceStatus_INSTANCE_STATUS_TERMINATED {
		t.Fatalf("after terminate: %v %v", got.GetStatus(), err)
	}
	term, err := h.cp.Admin.ListEvents(ctx, &v1.ListEventsRequest{InstanceId: claimed.Id, Kind: "instance.terminated", PageSize: 5})
	if err != nil || len(term.Events) == 0 {
		t.Fatalf("no instance.terminated event: %v", err)
	}

	// The event log shows the terminate live and links the claim.
	run(t, bctx, 30*time.Second, chromedp.Navigate(h.ts.URL+h.srv.Path("/events")),
		chromedp.WaitVisible(`#live-status.live-on`))
	if _, err := h.cp.Admin.PausePool(ctx, &v1.PoolActionRequest{Name: "web"}); err != nil {
		t.Fatal(err)
	}
	all, err := h.cp.Admin.ListInstances(ctx, &v1.ListInstancesRequest{Status: v1.InstanceStatus_INSTANCE_STATUS_RUNNING, PageSize: 10})
	if err != nil || len(all.Instances) == 0 {
		t.Fatalf("no running instance: %v", err)
	}
	running := all.Instances[0]
	if _, err := h.cp.Admin.HoldInstance(ctx, &v1.HoldInstanceRequest{Id: running.Id, Reason: "watch me"}); err != nil {
		t.Fatal(err)
	}
	run(t, bctx, 30*time.Second, until(`[...document.querySelectorAll('#event-table tr.fresh')].some(r => r.textContent.includes("instance.held"))`))
	shot(t, bctx, "events")

	// Create an exec task on a running member and watch its output arrive.
	run(t, bctx, 60*time.Second, chromedp.Navigate(h.ts.URL+h.srv.Path("/tasks/new?instance="+running.Id)),
		chromedp.WaitVisible(`#run`),
		chromedp.SendKeys(`input[name="argv"]`, "echo hello-from-the-dashboard"),
		chromedp.Click(`#run`, chromedp.NodeVisible))
	eventually(t, bctx, 60*time.Second, `document.getElementById("task-status") && document.getElementById("task-status").textContent.trim() === "succeeded"`)
	out := value(t, bctx, 10*time.Second, chromedp.Text(`#output`))
	if strings.TrimSpace(out) != "hello-from-the-dashboard" {
		t.Fatalf("task output %q", out)
	}
	shot(t, bctx, "task")
}

func TestBrowserViewerAndSecret(t *testing.T) {
	bctx := browser(t)
	h, _ := fakeFleet(t, "viewer")
	ctx := context.Background()
	fleet := h.cp.SeedFleet(ctx, "edge")
	inst, _ := h.cp.Provision(ctx, fleet.Node)

	run(t, bctx, 30*time.Second, chromedp.Navigate(h.ts.URL+h.srv.Path("/instances/"+inst.Id)),
		chromedp.WaitVisible(`section.summary`))
	buttons := value(t, bctx, 10*time.Second, chromedp.Evaluate[int](`document.querySelectorAll("[data-action], .actions").length`))
	if buttons != 0 {
		t.Fatalf("a viewer is offered %d actions", buttons)
	}
	// A forged POST from the page's own origin is refused by the dashboard.
	status := value(t, bctx, 30*time.Second, chromedp.Evaluate[int](fmt.Sprintf(`fetch(%q, {method: "POST"}).then(r => r.status)`,
		h.srv.Path("/instances/"+inst.Id+"/terminate")), chromedp.EvalAwaitPromise))
	if status != 403 {
		t.Fatalf("viewer's forged terminate: %d, want 403", status)
	}
	got, err := h.cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: inst.Id})
	if err != nil || got.Status == v1.InstanceStatus_INSTANCE_STATUS_TERMINATED {
		t.Fatalf("instance after forged terminate: %v %v", got.GetStatus(), err)
	}
	// Without the URL secret: 403.
	run(t, bctx, 30*time.Second, chromedp.Navigate(h.ts.URL+"/"))
	text := value(t, bctx, 10*time.Second, chromedp.Text(`body`))
	if !strings.Contains(text, "403") {
		t.Fatalf("page without the secret: %q", text)
	}
}
