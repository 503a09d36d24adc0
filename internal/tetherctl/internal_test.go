package tetherctl

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tetherfleet/tether/internal/apierr"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// fakeAdmin answers the few methods a test needs; any other call panics
// on the nil embedded interface, which fails the test loudly.
type fakeAdmin struct {
	v1.AdminServiceClient
	mu         sync.Mutex
	nodes      []string
	pageRows   int // rows per page whatever page_size asks for (a server budget)
	sizes      []int32
	sameToken  bool
	ignoreSize bool // answer pageRows rows even when fewer are asked for
	instance   *v1.Instance
	polled     chan struct{}
}

func (f *fakeAdmin) ListNodes(_ context.Context, req *v1.ListNodesRequest, _ ...grpc.CallOption) (*v1.ListNodesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sizes = append(f.sizes, req.PageSize)
	start := 0
	if req.PageToken != "" {
		fmt.Sscanf(req.PageToken, "after-%d", &start)
	}
	rows := min(f.pageRows, int(req.PageSize))
	if f.ignoreSize {
		rows = f.pageRows
	}
	end := min(start+rows, len(f.nodes))
	resp := &v1.ListNodesResponse{}
	for _, n := range f.nodes[start:end] {
		resp.Nodes = append(resp.Nodes, &v1.Node{Name: n})
	}
	if end < len(f.nodes) {
		resp.NextPageToken = fmt.Sprintf("after-%d", end)
		if f.sameToken {
			resp.NextPageToken = "stuck"
		}
	}
	return resp, nil
}

func (f *fakeAdmin) GetInstance(context.Context, *v1.GetInstanceRequest, ...grpc.CallOption) (*v1.Instance, error) {
	select {
	case f.polled <- struct{}{}:
	default:
	}
	return f.instance, nil
}

func testApp(ctx context.Context, c v1.AdminServiceClient) (*App, *bytes.Buffer, *bytes.Buffer) {
	var out, errb bytes.Buffer
	return &App{Stdout: &out, Stderr: &errb, Output: "table", Timeout: 5 * time.Second, base: ctx, client: c, target: "fake"}, &out, &errb
}

func names(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("node-%04d", i)
	}
	return out
}

// The client follows next_page_token whatever a page holds: it never takes
// a short page for the end, and never asks for more than --limit leaves.
func TestListFollowsTokensWhateverThePageHolds(t *testing.T) {
	for _, tc := range []struct {
		name       string
		total      int
		pageRows   int
		limit      int
		wantRows   int
		wantNote   string // on stderr; "" means nothing
		wantToken  bool   // the JSON keeps a next_page_token to continue with
		ignoreSize bool
	}{
		{"budget pages of 7, all", 50, 7, 0, 50, "", false, false},
		{"one row per page", 5, 1, 0, 5, "", false, false},
		{"empty list", 0, 7, 0, 0, "", false, false},
		{"limit on a page boundary", 50, 1000, 20, 20, "--page-token after-20", true, false},
		{"limit equals the list", 20, 7, 20, 20, "", false, false},
		{"server sends more than asked", 50, 7, 10, 10, "showing the first 10 nodes", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := &fakeAdmin{nodes: names(tc.total), pageRows: tc.pageRows, ignoreSize: tc.ignoreSize}
			a, out, errb := testApp(context.Background(), fake)
			a.Output = "json"
			err := list(a, v1.AdminServiceClient.ListNodes, &v1.ListNodesRequest{}, paging{limit: tc.limit},
				func(w *tabwriter.Writer, r *v1.ListNodesResponse) { nodeTable(w, r.Nodes) })
			if err != nil {
				t.Fatal(err)
			}
			var resp v1.ListNodesResponse
			if err := protojson.Unmarshal(out.Bytes(), &resp); err != nil {
				t.Fatalf("json: %v\n%s", err, out)
			}
			if len(resp.Nodes) != tc.wantRows {
				t.Fatalf("%d rows, want %d", len(resp.Nodes), tc.wantRows)
			}
			for i, n := range resp.Nodes {
				if n.Name != fmt.Sprintf("node-%04d", i) {
					t.Fatalf("row %d is %s: rows lost or repeated", i, n.Name)
				}
			}
			if (resp.NextPageToken != "") != tc.wantToken {
				t.Fatalf("next_page_token %q, want one: %v", resp.NextPageToken, tc.wantToken)
			}
			if tc.wantNote == "" && errb.Len() > 0 || !strings.Contains(errb.String(), tc.wantNote) {
				t.Fatalf("stderr %q, want %q", errb.String(), tc.wantNote)
			}
			received := 0
			for _, s := range fake.sizes {
				if s <= 0 || s > maxPageSize || tc.limit > 0 && int(s) > tc.limit-received {
					t.Fatalf("page sizes asked: %v (limit %d)", fake.sizes, tc.limit)
				}
				received += min(int(s), tc.pageRows)
			}
		})
	}
}

func TestListStopsOnARepeatedToken(t *testing.T) {
	fake := &fakeAdmin{nodes: names(10), pageRows: 3, sameToken: true}
	a, _, _ := testApp(context.Background(), fake)
	err := list(a, v1.AdminServiceClient.ListNodes, &v1.ListNodesRequest{}, paging{},
		func(w *tabwriter.Writer, r *v1.ListNodesResponse) { nodeTable(w, r.Nodes) })
	if err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("a server that repeats its token must not loop forever: %v", err)
	}
	if _, err := fetchAll(a, v1.AdminServiceClient.ListNodes, &v1.ListNodesRequest{}, paging{limit: -1}); err == nil {
		t.Fatal("--limit -1 accepted")
	}
}

// What nodes report reaches the operator's terminal only escaped; JSON
// carries it exactly.
func TestTablesEscapeWhatWouldDriveTheTerminal(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"plain", "agent 1.2 ü", "agent 1.2 ü"},
		{"ESC erase line", "ok\x1b[2Kforged", `ok\x1b[2Kforged`},
		{"OSC window title", "\x1b]0;pwned\x07", `\x1b]0;pwned\a`},
		{"newline forges a row", "boom\nstatus:  running", `boom\nstatus:  running`},
		{"carriage return", "a\rb", `a\rb`},
		{"tab shifts columns", "a\tb", `a\tb`},
		{"C1 CSI", "a\u009bb", `a\u009bb`},
		{"right-to-left override", "abc\u202edef", `abc\u202edef`},
		{"invalid UTF-8", "a\xffb", `a\xffb`},
		{"NUL and DEL", "a\x00b\x7f", `a\x00b\x7f`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := printable(tc.in); got != tc.want {
				t.Fatalf("printable(%q) = %q, want %q", tc.in, got, tc.want)
			}
			in := &v1.Instance{Id: "i-1", NodeName: "n", AgentVersion: tc.in, AgentError: tc.in, Addresses: []string{tc.in, "10.0.0.1"}}
			a, out, _ := testApp(context.Background(), nil)
			if err := a.print(in, func(w *tabwriter.Writer) { instanceDetail(w, in) }); err != nil {
				t.Fatal(err)
			}
			for _, r := range out.String() {
				if r != '\n' && (r < 0x20 || r == 0x7f || r >= 0x80 && r < 0xa0 || r == 0x202e) {
					t.Fatalf("raw %U in table output:\n%q", r, out.String())
				}
			}
			if got, want := strings.Count(out.String(), "\n"), 12; got != want {
				t.Fatalf("%d lines, want %d (a value forged a row):\n%s", got, want, out)
			}
			if !utf8.ValidString(tc.in) {
				return // proto3 strings are UTF-8 on the wire: JSON never sees this
			}
			a.Output = "json"
			out.Reset()
			if err := a.print(in, nil); err != nil {
				t.Fatal(err)
			}
			var back v1.Instance
			if err := protojson.Unmarshal(out.Bytes(), &back); err != nil {
				t.Fatal(err)
			}
			if back.AgentError != tc.in || back.Addresses[0] != tc.in {
				t.Fatalf("JSON changed the value: %q", back.AgentError)
			}
		})
	}
	// Task output keeps its lines and tabs, and loses the rest.
	if got := printableText("a\tb\nc\x1b]0;x\x07"); got != "a\tb\nc\\x1b]0;x\\a" {
		t.Fatalf("printableText = %q", got)
	}
}

// explain branches on the code and the ErrorInfo reason, not on words.
func TestExplainUsesReasonsNotWords(t *testing.T) {
	a, _, _ := testApp(context.Background(), nil)
	a.cfgSrc = "cfg.yaml"
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"database down, tagged", apierr.New(codes.Unavailable, apierr.DatabaseUnavailable, "store gone"), "its database is not"},
		{"same words, no reason", status.Error(codes.Unavailable, "the database is unavailable"), "cannot reach tetherd"},
		{"reworded, tagged", apierr.New(codes.Unavailable, apierr.DatabaseUnavailable, "postgres restarting"), "its database is not"},
		{"not found", status.Error(codes.NotFound, "node \"x\" not found"), `not found: node "x" not found`},
		{"message with ESC", status.Error(codes.FailedPrecondition, "instance is \x1b[2Kerror"), `\x1b[2K`},
		{"not a status", errors.New("plain"), "plain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := a.explain(tc.err); !strings.Contains(got, tc.want) {
				t.Fatalf("explain = %q, want %q in it", got, tc.want)
			}
		})
	}
}

// A server that closes connections at accept (tetherd at a connection
// limit) is explained as that, not as "is tetherd running?" (issue 26);
// nothing listening still is.
func TestExplainTellsALimitFromNoServer(t *testing.T) {
	closing, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer closing.Close()
	go func() {
		for {
			c, err := closing.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	goneAddr := gone.Addr().String()
	gone.Close()
	for _, tc := range []struct {
		name, addr, want string
	}{
		{"closed at accept", closing.Addr().String(), "at a connection limit"},
		{"nothing listening", goneAddr, "is `tetherd serve` running there?"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := grpc.NewClient(tc.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{ServerName: "x", MinVersion: tls.VersionTLS13})))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err = v1.NewAdminServiceClient(conn).ListNodes(ctx, &v1.ListNodesRequest{})
			a, _, _ := testApp(context.Background(), nil)
			if got := a.explain(err); !strings.Contains(got, tc.want) {
				t.Fatalf("explain(%v) = %q, want %q in it", err, got, tc.want)
			}
		})
	}
}

// instance wait polls until the instance is running; an interrupt ends it
// at once, long before --for.
func TestWaitStopsOnInterrupt(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fake := &fakeAdmin{instance: &v1.Instance{Id: "i-1", Status: v1.InstanceStatus_INSTANCE_STATUS_PROVISIONING}, polled: make(chan struct{}, 1)}
	a, _, _ := testApp(ctx, fake)
	done := make(chan error, 1)
	go func() { done <- a.waitRunning("i-1", time.Hour) }()
	<-fake.polled
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("wait after interrupt: %v", err)
	}
}

func TestPresenceText(t *testing.T) {
	lost := timestamppb.New(time.Now().Add(-12 * time.Second))
	for _, tc := range []struct {
		name string
		p    *v1.AgentPresence
		want string
	}{
		{"never", nil, "never connected"},
		{"connected", &v1.AgentPresence{Connected: true, Replica: "r1"}, "connected to replica r1"},
		{"lost", &v1.AgentPresence{Replica: "r1", LostAt: lost}, "lost 12s ago"},
		{"no time", &v1.AgentPresence{Replica: "r1"}, "not connected"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := presenceText(tc.p); got != tc.want {
				t.Fatalf("presenceText = %q, want %q", got, tc.want)
			}
		})
	}
}
