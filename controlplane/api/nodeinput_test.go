package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tetherfleet/tether/controlplane/api/admin/fleet"
	"github.com/tetherfleet/tether/controlplane/certificates"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/internal/clock"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// recvStream plays an agent's side of Connect: it hands the server the
// queued messages, then EOF.
type recvStream struct {
	grpc.ServerStream
	msgs []*v1.AgentMessage
}

func (s *recvStream) Recv() (*v1.AgentMessage, error) {
	if len(s.msgs) == 0 {
		return nil, io.EOF
	}
	m := s.msgs[0]
	s.msgs = s.msgs[1:]
	return m, nil
}

func (s *recvStream) Send(*v1.ControlMessage) error { return nil }

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func digest(c byte) string { return "sha256:" + strings.Repeat(string(c), 64) }

// A heartbeat carrying an oversized, malformed or control-character field
// is refused with InvalidArgument naming the field, and nothing of it is
// queued for the store.
func TestHeartbeatFieldsAreBoundedAndTyped(t *testing.T) {
	good := func() *v1.Heartbeat {
		return &v1.Heartbeat{Phase: v1.AgentPhase_AGENT_PHASE_MOUNTING, AgentVersion: "v1.2.3", BootId: "3f1c",
			Addresses: []string{"10.0.2.15", "fd00::15"}, RunningModuleDigests: []string{digest('a')}}
	}
	many := func(n int, s string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = s
		}
		return out
	}
	tests := []struct {
		name  string
		edit  func(*v1.Heartbeat)
		field string // "" when the heartbeat is accepted
	}{
		{"valid", func(*v1.Heartbeat) {}, ""},
		{"valid at every bound", func(hb *v1.Heartbeat) {
			// (A heartbeat error of 4,096 bytes is accepted by the list test.)
			hb.AgentVersion, hb.BootId = strings.Repeat("v", 128), strings.Repeat("b", 64)
			hb.Addresses, hb.RunningModuleDigests = many(64, "fd00:1111:2222:3333:4444:5555:6666:7777"), many(256, digest('f'))
		}, ""},
		{"address of 60,000 characters", func(hb *v1.Heartbeat) { hb.Addresses = []string{strings.Repeat("1", 60000)} }, "heartbeat.addresses[0]"},
		{"address not an IP", func(hb *v1.Heartbeat) { hb.Addresses = append(hb.Addresses, "example.org") }, "heartbeat.addresses[2]"},
		{"address with a CIDR suffix", func(hb *v1.Heartbeat) { hb.Addresses = []string{"10.0.2.15/24"} }, "heartbeat.addresses[0]"},
		{"address with a line break", func(hb *v1.Heartbeat) { hb.Addresses = []string{"10.0.2.15\nfd00::1"} }, "heartbeat.addresses[0]"},
		{"65 addresses", func(hb *v1.Heartbeat) { hb.Addresses = many(65, "10.0.0.1") }, "heartbeat.addresses"},
		{"digest without algorithm", func(hb *v1.Heartbeat) { hb.RunningModuleDigests = []string{strings.Repeat("a", 64)} }, "heartbeat.running_module_digests[0]"},
		{"digest upper-case", func(hb *v1.Heartbeat) { hb.RunningModuleDigests = []string{digest('A')} }, "heartbeat.running_module_digests[0]"},
		{"digest too long", func(hb *v1.Heartbeat) { hb.RunningModuleDigests = []string{digest('a') + "aa"} }, "heartbeat.running_module_digests[0]"},
		{"257 digests", func(hb *v1.Heartbeat) { hb.RunningModuleDigests = many(257, digest('a')) }, "heartbeat.running_module_digests"},
		{"agent_version too long", func(hb *v1.Heartbeat) { hb.AgentVersion = strings.Repeat("v", 129) }, "heartbeat.agent_version"},
		{"error too long", func(hb *v1.Heartbeat) { hb.Error = strings.Repeat("e", 4097) }, "heartbeat.error"},
		{"boot_id too long", func(hb *v1.Heartbeat) { hb.BootId = strings.Repeat("b", 65) }, "heartbeat.boot_id"},
		{"negative uptime", func(hb *v1.Heartbeat) { hb.UptimeSeconds = -1 }, "heartbeat.uptime_seconds"},
		// Terminal escape injection: ESC and OSC change an operator's
		// window title, a line break forges a row.
		{"ESC in error", func(hb *v1.Heartbeat) { hb.Error = "boom\x1b[2K\x1b]0;pwned\x07" }, "heartbeat.error"},
		{"newline in error", func(hb *v1.Heartbeat) { hb.Error = "boom\nINSTANCE running" }, "heartbeat.error"},
		{"carriage return in agent_version", func(hb *v1.Heartbeat) { hb.AgentVersion = "v1\rv9" }, "heartbeat.agent_version"},
		{"DEL in agent_version", func(hb *v1.Heartbeat) { hb.AgentVersion = "v1\x7f" }, "heartbeat.agent_version"},
		{"C1 CSI in error", func(hb *v1.Heartbeat) { hb.Error = "boom\u009b2J" }, "heartbeat.error"},
		{"NUL in boot_id", func(hb *v1.Heartbeat) { hb.BootId = "a\x00b" }, "heartbeat.boot_id"},
		{"line separator in error", func(hb *v1.Heartbeat) { hb.Error = "a\u2028b" }, "heartbeat.error"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hub := NewAgentHub(AgentHubConfig{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Flush: time.Second})
			a := &agentServer{Config: Config{Clock: clock.NewFake(t0), Agents: hub}}
			hb := good()
			tc.edit(hb)
			err := a.receive(context.Background(), &store.Instance{ID: "inst-1"}, &recvStream{msgs: []*v1.AgentMessage{{Msg: &v1.AgentMessage_Heartbeat{Heartbeat: hb}}}})
			queued := hub.Queued()
			if tc.field == "" {
				if !errors.Is(err, io.EOF) || queued != 1 {
					t.Fatalf("a valid heartbeat: err %v, %d queued", err, queued)
				}
				return
			}
			if status.Code(err) != codes.InvalidArgument || !strings.HasPrefix(status.Convert(err).Message(), tc.field+": ") {
				t.Fatalf("got %v, want InvalidArgument naming %s", err, tc.field)
			}
			if queued != 0 {
				t.Fatalf("a refused heartbeat was queued for the store: %d", queued)
			}
			if msg := status.Convert(err).Message(); strings.ContainsAny(msg, "\x1b\n\r\x07\x00") || len(msg) > 512 {
				t.Fatalf("the refusal carries what it refuses: %q", msg)
			}
		})
	}
}

func TestTaskUpdateTextIsRefusedWithControlCharacters(t *testing.T) {
	for _, tc := range []struct {
		u     *v1.TaskUpdate
		field string
	}{
		{&v1.TaskUpdate{TaskId: "t", ErrorMessage: "exit 1\x1b]0;x\x07"}, "task_update.error_message"},
		{&v1.TaskUpdate{TaskId: "t", Progress: "50%\r100%"}, "task_update.progress"},
		{&v1.TaskUpdate{TaskId: "t", ErrorMessage: strings.Repeat("e", 4097)}, "task_update.error_message"},
	} {
		a := &agentServer{Config: Config{Clock: clock.NewFake(t0)}}
		err := a.receive(context.Background(), &store.Instance{ID: "inst-1"}, &recvStream{msgs: []*v1.AgentMessage{{Msg: &v1.AgentMessage_TaskUpdate{TaskUpdate: tc.u}}}})
		if status.Code(err) != codes.InvalidArgument || !strings.HasPrefix(status.Convert(err).Message(), tc.field+": ") {
			t.Errorf("%+v: got %v, want InvalidArgument naming %s", tc.u, err, tc.field)
		}
	}
}

// A few nodes reporting the largest heartbeats the bounds allow cannot
// push one ListInstances response past the list budget: the page ends
// early with a token, and following the tokens returns every row once.
func TestListInstancesPagesWithinTheSizeBudget(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "t.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tpl := &store.Template{Name: "tpl", CreatedAt: t0, UpdatedAt: t0}
	if err := st.CreateTemplate(ctx, tpl); err != nil {
		t.Fatal(err)
	}
	node := &store.Node{Name: "n", TemplateID: tpl.ID, Enabled: true, Config: []byte("{}"), CreatedAt: t0, UpdatedAt: t0}
	if err := st.CreateNode(ctx, node); err != nil {
		t.Fatal(err)
	}
	const rows = 80
	var hbs []store.Heartbeat
	for i := range rows {
		in := &store.Instance{NodeID: node.ID, Status: "running", Provider: "external", CreatedAt: t0, UpdatedAt: t0}
		if err := st.CreateInstance(ctx, in); err != nil {
			t.Fatal(err)
		}
		// The largest heartbeat validHeartbeat accepts.
		hb := store.Heartbeat{InstanceID: in.ID, At: t0, Phase: "ready", AgentVersion: strings.Repeat("v", maxAgentVersion),
			AgentError: strings.Repeat("e", maxAgentError), BootID: strings.Repeat("b", maxBootID)}
		for j := range maxAddresses {
			hb.Addresses = append(hb.Addresses, fmt.Sprintf("fd00:1111:2222:3333:4444:5555:%04x:%04x", i, j))
		}
		for range maxDigests {
			hb.RunningModules = append(hb.RunningModules, digest('c'))
		}
		if err := validHeartbeat(&v1.Heartbeat{AgentVersion: hb.AgentVersion, Error: hb.AgentError, BootId: hb.BootID,
			Addresses: hb.Addresses, RunningModuleDigests: hb.RunningModules}); err != nil {
			t.Fatalf("the test's heartbeat is not the largest valid one: %v", err)
		}
		hbs = append(hbs, hb)
	}
	if err := st.RecordHeartbeats(ctx, hbs); err != nil {
		t.Fatal(err)
	}
	// Listing reads only the store: the services are there to satisfy New.
	a, err := fleet.New(fleet.Config{Reads: st, Clock: clock.Real{}, Instances: &instances.Service{}, Certificates: &certificates.Service{},
		CAFingerprint: func() string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	pages := 0
	req := &v1.ListInstancesRequest{PageSize: 1000}
	for {
		resp, err := a.ListInstances(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if n := proto.Size(resp); n > listBudget {
			t.Fatalf("page %d is %d bytes, over the %d budget", pages, n, listBudget)
		}
		for _, in := range resp.Instances {
			if seen[in.Id] {
				t.Fatalf("instance %s on two pages", in.Id)
			}
			seen[in.Id] = true
		}
		if resp.NextPageToken == "" {
			break
		}
		if len(resp.Instances) == 0 || pages > rows {
			t.Fatalf("page %d: %d rows with a next token", pages, len(resp.Instances))
		}
		req.PageToken = resp.NextPageToken
	}
	if len(seen) != rows || pages < 2 {
		t.Fatalf("%d of %d instances in %d pages; want all of them, in more than one page", len(seen), rows, pages)
	}
}
