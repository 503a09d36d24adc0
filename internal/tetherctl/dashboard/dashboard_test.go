package dashboard

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	"github.com/tetherfleet/tether/pki/ca"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// identityClient mints an admin-kind certificate with role from the
// control plane's own CA and returns an admin client speaking as it.
func identityClient(t testing.TB, cp *testcp.ControlPlane, name, role string) v1.AdminServiceClient {
	t.Helper()
	authority, err := ca.Load(filepath.Join(cp.DataDir, daemon.CADir), clock.Real{})
	if err != nil {
		t.Fatal(err)
	}
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := authority.SignAdmin(name, role, pub, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert}
	return v1.NewAdminServiceClient(cp.Dial(&tc))
}

type harness struct {
	cp  *testcp.ControlPlane
	srv *Server
	ts  *httptest.Server
}

func newHarness(t testing.TB, role string, opts ...testcp.Option) *harness {
	t.Helper()
	cp := testcp.Start(t, opts...)
	client := cp.Admin
	if role != "admin" {
		client = identityClient(t, cp, "pat", role)
	}
	srv, err := New(Config{Client: client, Identity: "pat", Role: role, Endpoint: cp.Addr})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	// Live pages hold event streams open: cut them, or Close waits forever.
	t.Cleanup(func() { ts.CloseClientConnections(); ts.Close() })
	return &harness{cp: cp, srv: srv, ts: ts}
}

func (h *harness) get(t testing.TB, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(h.ts.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (h *harness) post(t testing.TB, path string, form url.Values) (int, string) {
	t.Helper()
	resp, err := http.PostForm(h.ts.URL+path, form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestSecretIsRequired(t *testing.T) {
	h := newHarness(t, "admin")
	good := h.srv.Path("/")
	for _, tc := range []struct {
		path string
		want int
	}{
		{good, http.StatusOK},
		{"/", http.StatusForbidden},
		{"/t/", http.StatusForbidden},
		{"/t/wrong/", http.StatusForbidden},
		{"/t/" + h.srv.cfg.Secret[:len(h.srv.cfg.Secret)-1] + "/", http.StatusForbidden},
		{"/instances", http.StatusForbidden},
		{"/static/app.css", http.StatusForbidden},
		{h.srv.Path("/static/app.css"), http.StatusOK},
	} {
		if code, body := h.get(t, tc.path); code != tc.want {
			t.Errorf("GET %s: %d, want %d\n%s", tc.path, code, tc.want, body)
		}
	}
	// An action without the secret is refused before anything is called.
	fleet := h.cp.SeedFleet(context.Background(), "edge")
	inst, _ := h.cp.Provision(context.Background(), fleet.Node)
	if code, _ := h.post(t, "/t/nope/instances/"+inst.Id+"/terminate", nil); code != http.StatusForbidden {
		t.Fatalf("forged terminate without the secret: %d", code)
	}
	got, err := h.cp.Admin.GetInstance(context.Background(), &v1.GetInstanceRequest{Id: inst.Id})
	if err != nil || got.Status == v1.InstanceStatus_INSTANCE_STATUS_TERMINATED {
		t.Fatalf("instance after refused action: %v %v", got.GetStatus(), err)
	}
}

func TestCrossOriginPostRefused(t *testing.T) {
	h := newHarness(t, "admin")
	req, _ := http.NewRequest(http.MethodPost, h.ts.URL+h.srv.Path("/pools/x/pause"), nil)
	req.Header.Set("Origin", "http://evil.example")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("cross-origin POST: %d, want 403", resp.StatusCode)
	}
}

func TestRoleDecidesActions(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		role       string
		buttons    bool
		postCode   int
		terminated bool
	}{
		{"viewer", false, http.StatusForbidden, false},
		{"operator", true, http.StatusOK, true},
	} {
		t.Run(tc.role, func(t *testing.T) {
			h := newHarness(t, tc.role)
			fleet := h.cp.SeedFleet(ctx, "edge")
			inst, _ := h.cp.Provision(ctx, fleet.Node)
			code, body := h.get(t, h.srv.Path("/instances/"+inst.Id))
			if code != http.StatusOK {
				t.Fatalf("instance page: %d\n%s", code, body)
			}
			if has := strings.Contains(body, `data-action="terminate"`); has != tc.buttons {
				t.Fatalf("terminate button offered=%v, want %v", has, tc.buttons)
			}
			if code, _ := h.get(t, h.srv.Path("/instances/"+inst.Id+"/confirm?action=terminate")); tc.role == "viewer" && code != http.StatusForbidden {
				t.Fatalf("viewer confirm page: %d, want 403", code)
			}
			code, body = h.post(t, h.srv.Path("/instances/"+inst.Id+"/terminate"), nil)
			if code != tc.postCode {
				t.Fatalf("POST terminate: %d, want %d\n%s", code, tc.postCode, body)
			}
			got, err := h.cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: inst.Id})
			if err != nil {
				t.Fatal(err)
			}
			if term := got.Status == v1.InstanceStatus_INSTANCE_STATUS_TERMINATED; term != tc.terminated {
				t.Fatalf("instance is %v; terminated=%v, want %v", got.Status, term, tc.terminated)
			}
		})
	}
}

// A refusal shows tetherd's code and message word for word.
func TestActionShowsServerAnswer(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, "admin")
	fleet := h.cp.SeedFleet(ctx, "edge")
	inst, _ := h.cp.Provision(ctx, fleet.Node)
	if _, err := h.cp.Admin.HoldInstance(ctx, &v1.HoldInstanceRequest{Id: inst.Id, Reason: "maintenance"}); err != nil {
		t.Fatal(err)
	}
	_, want := h.cp.Admin.TerminateInstance(ctx, &v1.InstanceActionRequest{Id: inst.Id})
	if want == nil {
		t.Fatal("terminate of a held instance succeeded")
	}
	code, body := h.post(t, h.srv.Path("/instances/"+inst.Id+"/terminate"), nil)
	if code != http.StatusBadRequest || !strings.Contains(body, "FailedPrecondition") {
		t.Fatalf("held terminate: %d\n%s", code, body)
	}
	msg := want.Error()[strings.Index(want.Error(), "desc = ")+len("desc = "):]
	if !strings.Contains(body, templateEscape(msg)) {
		t.Fatalf("page does not show the server's words %q:\n%s", msg, body)
	}
}

func templateEscape(s string) string {
	r := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&#34;", "'", "&#39;")
	return r.Replace(s)
}

func TestInstancesListPagesAndFilters(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, "admin")
	fleet := h.cp.SeedFleet(ctx, "edge")
	var ids []string
	for i := 0; i < 25; i++ {
		in, _ := h.cp.Provision(ctx, fleet.Node)
		ids = append(ids, in.Id)
	}
	seen := map[string]bool{}
	next := h.srv.Path("/instances?size=10")
	for pages := 0; next != ""; pages++ {
		if pages > 5 {
			t.Fatal("paging does not end")
		}
		code, body := h.get(t, next)
		if code != http.StatusOK {
			t.Fatalf("%s: %d\n%s", next, code, body)
		}
		for _, id := range ids {
			if strings.Contains(body, `data-id="`+id+`"`) {
				seen[id] = true
			}
		}
		next = ""
		if i := strings.Index(body, `rel="next" href="`); i >= 0 {
			rest := body[i+len(`rel="next" href="`):]
			next = strings.ReplaceAll(rest[:strings.Index(rest, `"`)], "&amp;", "&")
		}
	}
	if len(seen) != len(ids) {
		t.Fatalf("paged through %d of %d instances", len(seen), len(ids))
	}
	code, body := h.get(t, h.srv.Path("/instances?q="+ids[3]))
	if code != http.StatusOK || strings.Count(body, `data-id="`) != 1 {
		t.Fatalf("text filter: %d, %d rows", code, strings.Count(body, `data-id="`))
	}
	if code, body := h.get(t, h.srv.Path("/instances?state=sleeping")); code != http.StatusBadRequest || !strings.Contains(body, "sleeping") {
		t.Fatalf("bad state filter: %d\n%s", code, body)
	}
}

func TestFleetPageCountsAndEscapes(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, "admin")
	fleet := h.cp.SeedFleet(ctx, "edge")
	for i := 0; i < 3; i++ {
		h.cp.Provision(ctx, fleet.Node)
	}
	code, body := h.get(t, h.srv.Path("/"))
	if code != http.StatusOK {
		t.Fatalf("fleet: %d\n%s", code, body)
	}
	if !strings.Contains(body, `data-count="total">3<`) {
		t.Fatalf("fleet page lacks the total of 3:\n%s", body)
	}
	if code, frag := h.get(t, h.srv.Path("/fragment/fleet")); code != http.StatusOK || strings.Contains(frag, "<html") {
		t.Fatalf("fragment: %d, whole page=%v", code, strings.Contains(frag, "<html"))
	}
}

func TestTimelineSVG(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	in := &v1.Instance{CreatedAt: timestamppb.New(t0), Status: v1.InstanceStatus_INSTANCE_STATUS_RUNNING}
	evs := []*v1.FleetEvent{
		{Kind: "instance.running", CreatedAt: timestamppb.New(t0.Add(6 * time.Second))},
		{Kind: "instance.machine_created", CreatedAt: timestamppb.New(t0.Add(500 * time.Millisecond))},
	}
	evs = append(evs, &v1.FleetEvent{Kind: "enroll.succeeded", CreatedAt: timestamppb.New(t0.Add(4 * time.Second))})
	marks := bootMarks(in, evs, t0.Add(time.Minute))
	var got []string
	for _, m := range marks {
		got = append(got, m.Name)
	}
	if strings.Join(got, ",") != "requested,machine created,enrolled,running" {
		t.Fatalf("marks %v", got)
	}
	svg := string(timelineSVG(marks))
	for _, want := range []string{"500ms", "3.5s", "2s", `aria-label="boot timeline, 6s in total"`} {
		if !strings.Contains(svg, want) {
			t.Errorf("timeline lacks %q:\n%s", want, svg)
		}
	}
	if strings.Count(svg, "<rect") != 3 {
		t.Errorf("want 3 spans:\n%s", svg)
	}
	// A boot still under way ends at now in its current phase.
	booting := &v1.Instance{CreatedAt: timestamppb.New(t0), AgentPhase: v1.AgentPhase_AGENT_PHASE_PULLING}
	marks = bootMarks(booting, evs[2:], t0.Add(5*time.Second))
	if marks[len(marks)-1].Name != "pulling (now)" {
		t.Fatalf("booting marks %v", marks)
	}
	if s := string(timelineSVG(marks[:1])); !strings.Contains(s, "No boot phases") {
		t.Fatalf("one mark: %s", s)
	}
}

func TestPoolHistoryUndoesEvents(t *testing.T) {
	now := time.Date(2026, 12, 1, 13, 0, 0, 0, time.UTC)
	ev := func(kind string, ago time.Duration, kv ...string) *v1.FleetEvent {
		fields := map[string]any{}
		for i := 0; i+1 < len(kv); i += 2 {
			fields[kv[i]] = kv[i+1]
		}
		p, _ := structpb.NewStruct(fields)
		return &v1.FleetEvent{Kind: kind, CreatedAt: timestamppb.New(now.Add(-ago)), Payload: p}
	}
	// Newest first: a claim 10 min ago, a member ready 20 min ago, its
	// provision 30 min ago; something 2 h ago is outside the window.
	evs := []*v1.FleetEvent{
		ev("pool.claimed", 10*time.Minute),
		ev("pool.member_ready", 20*time.Minute, "pool_state", "ready"),
		ev("instance.provisioned", 30*time.Minute),
		ev("pool.claimed", 2*time.Hour),
	}
	pts := poolHistory(&v1.PoolCounts{Ready: 1, Claimed: 1}, evs, now.Add(-time.Hour), now)
	type c struct{ w, r, cl int }
	var got []c
	for _, p := range pts {
		got = append(got, c{p.Warming, p.Ready, p.Claimed})
	}
	want := []c{{0, 1, 0}, {0, 1, 0}, {1, 1, 0}, {0, 2, 0}, {0, 1, 1}}
	if len(got) != len(want) {
		t.Fatalf("points %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("points %v, want %v", got, want)
		}
	}
	svg := string(countsSVG(pts, now.Add(-time.Hour), now))
	if strings.Count(svg, "<polyline") != 3 {
		t.Fatalf("want 3 series:\n%s", svg)
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no client", Config{Role: "admin"}, "no admin client"},
		{"unknown role", Config{Client: v1.NewAdminServiceClient(nil), Role: "root"}, `unknown role "root"`},
		{"short secret", Config{Client: v1.NewAdminServiceClient(nil), Role: "viewer", Secret: "abc"}, "too short"},
	} {
		if _, err := New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
