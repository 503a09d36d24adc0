package netboot_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/netboot"
	"github.com/tetherfleet/tether/controlplane/store"
)

const mac = "52:54:00:12:34:56"

func (f *fixture) bindMAC(t *testing.T, macs ...string) {
	t.Helper()
	n, err := f.st.GetNode(f.ctx, "n")
	if err != nil {
		t.Fatal(err)
	}
	n.MACs = macs
	if err := f.st.Tx(f.ctx, func(q store.Queries) error { return q.UpdateNode(f.ctx, n) }); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) machineRefusals(t *testing.T) []*store.Event {
	t.Helper()
	evs, err := f.st.ListEvents(f.ctx, store.EventFilter{Kind: events.NetbootMachineRefused}, store.Page{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

func (f *fixture) tokens(t *testing.T) int {
	t.Helper()
	evs, err := f.st.ListEvents(f.ctx, store.EventFilter{Kind: events.NetbootServed}, store.Page{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	return len(evs)
}

func TestBootRouteServesTheNodesBootingInstanceOnce(t *testing.T) {
	f := setup(t)
	f.bindMAC(t, mac)
	in := f.provision(t)
	// Any accepted spelling of the address finds the node.
	code, body := f.get(t, netboot.BootPath("52-54-00-12-34-56"))
	if code != http.StatusOK || !strings.HasPrefix(body, "#!ipxe\nkernel ") {
		t.Fatalf("%d %q", code, body)
	}
	for _, want := range []string{" ip=dhcp BOOTIF=01-52-54-00-12-34-56 ", "tether.token=", "\nboot\n"} {
		if !strings.Contains(body, want) {
			t.Errorf("script lacks %q:\n%s", want, body)
		}
	}
	kernelLine := strings.SplitN(body, "\n", 3)[1]
	if !strings.Contains(kernelLine, "ip=dhcp") || !strings.Contains(kernelLine, "BOOTIF=") {
		t.Fatalf("ip=dhcp and BOOTIF= are not on the kernel line: %q", kernelLine)
	}
	// The second fetch in the same boot: 410, a high-severity event, no token.
	code, body = f.get(t, netboot.BootPath(mac))
	if code != http.StatusGone || strings.Contains(body, "tether.token") {
		t.Fatalf("second fetch: %d %q", code, body)
	}
	evs, _ := f.st.ListEvents(f.ctx, store.EventFilter{InstanceID: in.ID, Kind: events.NetbootRefused, MinSeverity: events.High}, store.Page{Limit: 10})
	if len(evs) != 1 {
		t.Fatalf("%d high-severity refusal events, want 1", len(evs))
	}
}

func TestScriptByIDCarriesDHCP(t *testing.T) {
	f := setup(t)
	in := f.provision(t)
	_, body := f.get(t, netboot.ScriptPath(in.ID.String()))
	if !strings.Contains(body, " ip=dhcp BOOTIF=01-${netX/mac:hexhyp} ") {
		t.Fatalf("script by id lacks ip=dhcp and an iPXE-filled BOOTIF:\n%s", body)
	}
}

func TestBootRouteRefusals(t *testing.T) {
	tests := []struct {
		name, query string
		setup       func(t *testing.T, f *fixture)
		reason      string // payload reason
		eventMAC    string
		console     string // in the refusal script
	}{
		{"unknown mac", "mac=52:54:00:99:99:99", nil, events.RefusedUnknownMAC, "52:54:00:99:99:99", "no node has hardware address 52:54:00:99:99:99"},
		{"no booting instance", "mac=" + mac, func(t *testing.T, f *fixture) { f.bindMAC(t, mac) }, events.RefusedNotBooting, mac, "node n has no instance that is booting"},
		{"instance being terminated", "mac=" + mac, func(t *testing.T, f *fixture) {
			f.bindMAC(t, mac)
			// Terminate asked for, the machine not yet destroyed: still provisioning.
			in := f.provision(t)
			at := t0
			in.TerminateRequestedAt = &at
			if err := f.st.UpdateInstance(f.ctx, in); err != nil {
				t.Fatal(err)
			}
		}, events.RefusedNotBooting, mac, "node n has no instance that is booting"},
		{"missing", "", nil, events.RefusedMalformed, "", "exactly one mac"},
		{"twice", "mac=" + mac + "&mac=" + mac, nil, events.RefusedMalformed, "", "exactly one mac"},
		{"other parameter", "mac=" + mac + "&id=x", nil, events.RefusedMalformed, "", "other than mac"},
		{"short", "mac=52:54:00:12:34", nil, events.RefusedMalformed, "", "not a valid hardware address"},
		{"injection", "mac=" + url.QueryEscape("52:54:00:12:34:56\nshell"), nil, events.RefusedMalformed, "", "not a valid hardware address"},
		{"multicast", "mac=01:00:5e:00:00:01", nil, events.RefusedMalformed, "", "not a valid hardware address"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := setup(t)
			if tc.setup != nil {
				tc.setup(t, f)
			}
			before := len(f.machineRefusals(t))
			code, body := f.get(t, "/ipxe/boot?"+tc.query)
			if code != http.StatusOK || !strings.HasPrefix(body, "#!ipxe\necho ") || !strings.HasSuffix(body, "\nexit 1\n") ||
				strings.Count(body, "\n") != 3 || !strings.Contains(body, tc.console) {
				t.Fatalf("refusal script: %d %q", code, body)
			}
			evs := f.machineRefusals(t)
			if len(evs) != before+1 {
				t.Fatalf("%d new netboot.refused events, want 1", len(evs)-before)
			}
			p := evs[0].Payload
			if !strings.Contains(string(p), `"reason":"`+tc.reason+`"`) || !strings.Contains(string(p), `"mac":"`+tc.eventMAC+`"`) {
				t.Fatalf("event payload %s, want reason %s and mac %q", p, tc.reason, tc.eventMAC)
			}
			if f.tokens(t) != 0 {
				t.Fatal("a refused machine got a script")
			}
		})
	}
}

func TestBootRouteRefusalsCoalesce(t *testing.T) {
	f := setup(t)
	// A machine retrying in a loop leaves one event per reason, not one
	// per try; so does a sender of malformed requests.
	for range 5 {
		f.get(t, "/ipxe/boot?mac=52:54:00:99:99:99")
		f.get(t, "/ipxe/boot?mac=nonsense")
		f.get(t, "/ipxe/boot?mac=zz")
	}
	if n := len(f.machineRefusals(t)); n != 2 {
		t.Fatalf("%d events for repeated refusals within the window, want 2", n)
	}
	// Past the window, a still-refused machine is recorded again.
	f.clk.Advance(2 * time.Minute)
	f.get(t, "/ipxe/boot?mac=52:54:00:99:99:99")
	if n := len(f.machineRefusals(t)); n != 3 {
		t.Fatalf("%d events after the window, want 3", n)
	}
}

// Issue 26: one sender naming 2,000 made-up hardware addresses wrote
// 2,000 events (and 1,000 rows in `netboot seen`). Now a source gets
// perSourceMachines events per window and one summary with the count of
// the rest.
func TestRandomMACFloodIsCoalescedPerSource(t *testing.T) {
	f := setup(t)
	const flood = 300
	for i := range flood {
		m := fmt.Sprintf("52:54:00:aa:%02x:%02x", i/256, i%256)
		if code, _ := f.get(t, netboot.BootPath(m)); code != http.StatusOK {
			t.Fatalf("refusal %d: status %d", i, code)
		}
	}
	perMAC := 0
	for _, e := range f.machineRefusals(t) {
		if !strings.Contains(e.Message, "more requests from") {
			perMAC++
		}
	}
	if perMAC > 16 {
		t.Fatalf("%d events for %d made-up addresses from one source, want at most 16", perMAC, flood)
	}
	f.clk.Advance(2 * time.Minute)
	f.nb.FlushRefusals(f.ctx, false)
	var summary *store.Event
	for _, e := range f.machineRefusals(t) {
		if strings.Contains(e.Message, "more requests from") {
			if summary != nil {
				t.Fatal("two summaries for one source's window")
			}
			summary = e
		}
	}
	if summary == nil || !strings.Contains(summary.Message, fmt.Sprintf("refused %d more", flood-perMAC)) {
		t.Fatalf("summary %v, want the %d held-back refusals counted", summary, flood-perMAC)
	}
}

// Many senders (issue 26's probe used 49), each within its own 16, still
// record at most 256 refusals one by one in a window; the rest are one
// summary over all sources, and a later window records again.
func TestMachineRefusalsFromManySourcesAreCapped(t *testing.T) {
	f := setup(t)
	h := f.nb.Handler()
	const sources, perSource = 49, 16
	refuse := func(src, i int) {
		req := httptest.NewRequest(http.MethodGet, netboot.BootPath(fmt.Sprintf("52:54:01:%02x:%02x:%02x", src, i, f.clk.Now().Minute())), nil)
		req.RemoteAddr = fmt.Sprintf("10.9.%d.%d:4011", src/200, src%200+1)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Fatalf("source %d, machine %d: status %d", src, i, rec.Code)
		}
	}
	for src := range sources {
		for i := range perSource {
			refuse(src, i)
		}
	}
	count := func() (single int, allSummaries []*store.Event) {
		evs, err := f.st.ListEvents(f.ctx, store.EventFilter{Kind: events.NetbootMachineRefused}, store.Page{Limit: 2000})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			switch {
			case strings.Contains(e.Message, "from many sources"):
				allSummaries = append(allSummaries, e)
			case !strings.Contains(e.Message, "more requests from"):
				single++
			}
		}
		return single, allSummaries
	}
	if single, _ := count(); single != 256 {
		t.Fatalf("%d refusals recorded one by one from %d sources, want the cap of 256", single, sources)
	}
	f.clk.Advance(2 * time.Minute)
	f.nb.FlushRefusals(f.ctx, false)
	_, sums := count()
	if want := fmt.Sprintf("refused %d more", sources*perSource-256); len(sums) != 1 || !strings.Contains(sums[0].Message, want) {
		t.Fatalf("summaries over all sources %v, want one saying %q", sums, want)
	}
	// The next window records again.
	refuse(0, 0)
	if single, _ := count(); single != 257 {
		t.Fatalf("%d refusals recorded one by one after the window, want 257", single)
	}
}
