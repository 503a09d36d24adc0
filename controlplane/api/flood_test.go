package api_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
	"github.com/tetherfleet/tether/providers/external"
)

// Anyone can replay a spent bootstrap token or ask for a script that was
// already served; neither needs a credential. Thousands of tries leave a
// bounded number of event rows (one per key and window, then one summary
// with the count), the rate limit answers most of them before any work,
// and retention trims what is left.
func TestRefusalFloodsLeaveBoundedEvents(t *testing.T) {
	const tries, burst = floodTries, 50
	clk := clock.NewFake(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	logs := &logBuffer{}
	cp := lifecycleCP(t, logs, func(o *daemon.ServeOptions) {
		o.Test.NetbootListener = lis
		o.Clock = clk
		o.Limits.UnauthenticatedRate, o.Limits.UnauthenticatedBurst = 1, burst
	}, pxe{external.New()})
	// Thousands of calls: slow under the race detector on a busy machine.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	fleet := cp.SeedFleet(ctx, "metal")
	in := provisionPXE(t, cp, fleet.Node)
	get := func() (int, string) {
		resp, err := http.Get("http://" + lis.Addr().String() + "/ipxe/" + in.Id)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, script := get()
	if code != http.StatusOK {
		t.Fatalf("first fetch: %d %s", code, script)
	}
	i := strings.Index(script, "tether.token=")
	token := strings.Fields(script[i+len("tether.token="):])[0]
	enrollC := v1.NewEnrollmentServiceClient(cp.Dial(nil))
	key := testcp.NewNodeKey(t)
	if _, err := enrollC.Enroll(ctx, &v1.EnrollRequest{Token: token, CsrPem: key.CSRPEM}); err != nil {
		t.Fatal(err)
	}

	// The replays are somebody else's: the token with another key (the
	// node's own key with its spent token is its retry, answered again).
	other := testcp.NewNodeKey(t)
	flood := func() (enrollCodes map[codes.Code]int, fetchCodes map[int]int) {
		enrollCodes, fetchCodes = map[codes.Code]int{}, map[int]int{}
		for range tries {
			_, err := enrollC.Enroll(ctx, &v1.EnrollRequest{Token: token, CsrPem: other.CSRPEM})
			enrollCodes[status.Code(err)]++
			code, _ := get()
			fetchCodes[code]++
		}
		return
	}
	enrollCodes, fetchCodes := flood()
	// The burst (less the enrollment and the fetch above) passes to the
	// token check; the rest is refused for its rate before any work.
	if enrollCodes[codes.Unauthenticated] != burst-1 || enrollCodes[codes.ResourceExhausted] != tries-burst+1 {
		t.Fatalf("replays: %v", enrollCodes)
	}
	if fetchCodes[http.StatusGone] != burst-1 || fetchCodes[http.StatusTooManyRequests] != tries-burst+1 {
		t.Fatalf("fetches: %v", fetchCodes)
	}

	count := func(kind store.EventKind) []*v1.FleetEvent {
		resp, err := cp.Admin.ListEvents(ctx, &v1.ListEventsRequest{Kind: kind.String(), InstanceId: in.Id, PageSize: 1000})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Events
	}
	for _, kind := range []store.EventKind{events.EnrollTokenReused, events.NetbootRefused} {
		if evs := count(kind); len(evs) != 1 {
			t.Fatalf("%s: %d events in one window, want 1", kind, len(evs))
		}
	}

	// When the window ends, one summary per key carries the count.
	clk.Advance(2 * time.Minute)
	for _, kind := range []store.EventKind{events.EnrollTokenReused, events.NetbootRefused} {
		deadline := time.Now().Add(10 * time.Second)
		for {
			evs := count(kind)
			if len(evs) == 2 {
				if n := evs[0].Payload.GetFields()["count"].GetNumberValue(); n != burst-2 {
					t.Fatalf("%s summary counts %v, want %d: %v", kind, n, burst-2, evs[0])
				}
				break
			}
			if len(evs) > 2 || time.Now().After(deadline) {
				t.Fatalf("%s: %d events after the window, want 2", kind, len(evs))
			}
			time.Sleep(20 * time.Millisecond) // polls the flush loop of a running tetherd
		}
	}

	// The next window: the buckets have refilled, a second flood passes
	// the burst again and writes one more event per key.
	clk.Advance(time.Hour)
	flood()
	cp.Stop() // flushes what is still held
	st, err := sqlite.Open(context.Background(), filepath.Join(cp.DataDir, daemon.SQLiteFile))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rows := func() int {
		n := 0
		for _, kind := range []store.EventKind{events.EnrollTokenReused, events.NetbootRefused} {
			evs, err := st.ListEvents(context.Background(), store.EventFilter{Kind: kind}, store.Page{Limit: store.MaxPageSize})
			if err != nil {
				t.Fatal(err)
			}
			n += len(evs)
		}
		return n
	}
	// 2 × (first + summary) per route: 8 rows for 4 floods of thousands.
	if n := rows(); n != 8 {
		t.Fatalf("%d refusal events after two floods of %d on each route, want 8", n, tries)
	}
	// Retention (the defaults: medium events 90 days, high 365) trims
	// every one of them.
	later := clk.Now().Add(366 * 24 * time.Hour)
	if _, err := st.PruneEvents(context.Background(), later.Add(-90*24*time.Hour), later.Add(-365*24*time.Hour), 0); err != nil {
		t.Fatal(err)
	}
	if n := rows(); n != 0 {
		t.Fatalf("%d flood events survived retention", n)
	}
	noTokenLogged(t, logs)
}
