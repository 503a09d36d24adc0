package dashboard

import (
	"context"
	"fmt"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"net/http"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// BenchmarkFleetPage renders the fleet page for 10,000 instances in 100
// pools, seeded straight into a real tetherd's store. The time is the
// dashboard's server time: every list call to tetherd over TLS, plus the
// render. Run with:
//
//	go test -tags nobadger,nobbolt,nomysql -run '^$' -bench FleetPage -benchtime 20x ./internal/tetherctl/dashboard/
func BenchmarkFleetPage(b *testing.B) {
	const pools, perPool = 100, 100
	ctx := context.Background()
	// The loops tick every 200 ms in tests; over 10,000 instances that is
	// load no real deployment has (the reaper ticks every 60 s).
	h := newHarness(b, "admin", testcp.With(func(o *daemon.ServeOptions) { o.Loops.Every = time.Hour }))
	fleet := h.cp.SeedFleet(ctx, "seed")
	st, err := sqlite.Open(ctx, filepath.Join(h.cp.DataDir, daemon.SQLiteFile))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	t0 := time.Now().Add(-time.Hour)
	for p := 0; p < pools; p++ {
		pool, err := h.cp.Admin.CreatePool(ctx, &v1.CreatePoolRequest{Name: fmt.Sprintf("pool-%03d", p), Template: fleet.Template,
			Provider: "qemu", TargetSize: 0})
		if err != nil {
			b.Fatal(err)
		}
		err = st.Tx(ctx, func(q store.Queries) error {
			for i := 0; i < perPool; i++ {
				node := &store.Node{Name: fmt.Sprintf("%s-%03d", pool.Name, i), TemplateID: store.TemplateID(pool.TemplateId), Enabled: true,
					Config: []byte("{}"), CreatedAt: t0, UpdatedAt: t0}
				if err := q.CreateNode(ctx, node); err != nil {
					return err
				}
				w := t0.Add(time.Duration(i) * time.Millisecond)
				// A fresh heartbeat, or liveness spends the run presuming them dead.
				hb := time.Now().Add(time.Hour)
				if err := q.CreateInstance(ctx, &store.Instance{NodeID: node.ID, Status: "running", Provider: "external",
					CloudInstanceID: node.Name, CreatedAt: w, UpdatedAt: w, PoolMember: store.PoolMember{PoolID: store.PoolID(pool.Id), PoolState: lifecycle.PoolReady, PoolWarmingStartedAt: &w, PoolReadyAt: &w}, AgentReport: store.AgentReport{LastHeartbeatAt: &hb, Addresses: []string{"10.9.0.1"}}}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	url := h.ts.URL + h.srv.Path("/")
	var lat []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		resp, err := http.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("fleet page: %d", resp.StatusCode)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

// BenchmarkLiveEventDelay measures, in a real browser, the delay from an
// event's commit in tetherd (its created_at) to its row appearing in an
// open events page (the page's own clock, on the same machine). Run with:
//
//	go test -tags nobadger,nobbolt,nomysql -run '^$' -bench LiveEventDelay -benchtime 1x ./internal/tetherctl/dashboard/
func BenchmarkLiveEventDelay(b *testing.B) {
	const events = 100
	bctx := browser(b)
	ctx := context.Background()
	h := newHarness(b, "admin")
	fleet := h.cp.SeedFleet(ctx, "edge")
	inst, _ := h.cp.Provision(ctx, fleet.Node)
	run(b, bctx, 30*time.Second, chromedp.Navigate(h.ts.URL+h.srv.Path("/events?kind=instance.held")),
		chromedp.WaitVisible(`#live-status.live-on`),
		void(chromedp.Evaluate[int](`window.__arrived = {};
			new MutationObserver(ms => { for (const m of ms) for (const n of m.addedNodes)
				if (n.dataset && n.dataset.eventId) window.__arrived[n.dataset.eventId] = Date.now(); })
			.observe(document.querySelector('#event-table tbody'), {childList: true}); 1`)))
	var delays []time.Duration
	for i := 0; i < b.N; i++ {
		for j := 0; j < events; j++ {
			if _, err := h.cp.Admin.HoldInstance(ctx, &v1.HoldInstanceRequest{Id: inst.Id, Reason: "bench"}); err != nil {
				b.Fatal(err)
			}
			if _, err := h.cp.Admin.UnholdInstance(ctx, &v1.InstanceActionRequest{Id: inst.Id}); err != nil {
				b.Fatal(err)
			}
		}
		resp, err := h.cp.Admin.ListEvents(ctx, &v1.ListEventsRequest{Kind: "instance.held", PageSize: 1000})
		if err != nil {
			b.Fatal(err)
		}
		want := len(resp.Events)
		eventually(b, bctx, 60*time.Second, fmt.Sprintf(`Object.keys(window.__arrived).length >= %d`, want))
		arrived := value(b, bctx, 10*time.Second, chromedp.Evaluate[map[string]float64](`window.__arrived`))
		for _, e := range resp.Events {
			ms, ok := arrived[e.Id]
			if !ok {
				b.Fatalf("event %s never appeared", e.Id)
			}
			delays = append(delays, time.UnixMilli(int64(ms)).Sub(e.CreatedAt.AsTime()))
		}
		run(b, bctx, 10*time.Second, void(chromedp.Evaluate[int](`window.__arrived = {}; 1`)))
	}
	slices.Sort(delays)
	b.ReportMetric(float64(delays[len(delays)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(delays[len(delays)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(len(delays)), "events")
}
