package session

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

func TestBackoffCeilings(t *testing.T) {
	b := DefaultBackoff(nil)
	want := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second}
	for n, w := range want {
		if got := b.Ceiling(n); got != w {
			t.Errorf("Ceiling(%d) = %v, want %v", n, got, w)
		}
	}
	if got := b.Ceiling(1000); got != 30*time.Second {
		t.Errorf("Ceiling(1000) = %v: overflow", got)
	}
}

// TestBackoffFullJitter checks the delays are spread uniformly over the
// whole [0, ceiling] interval, which is what keeps agents that lost the
// control plane together from reconnecting together.
func TestBackoffFullJitter(t *testing.T) {
	b := DefaultBackoff(rand.New(rand.NewPCG(1, 2)))
	const samples = 20000
	for _, attempt := range []int{0, 3, 6, 12} {
		ceil := b.Ceiling(attempt)
		var sum float64
		var buckets [4]int
		for i := 0; i < samples; i++ {
			d := b.Delay(attempt)
			if d < 0 || d > ceil {
				t.Fatalf("attempt %d: delay %v outside [0, %v]", attempt, d, ceil)
			}
			sum += float64(d)
			buckets[min(int(4*float64(d)/float64(ceil)), 3)]++
		}
		if mean := sum / samples / float64(ceil); mean < 0.48 || mean > 0.52 {
			t.Errorf("attempt %d: mean is %.3f of the ceiling, want about 0.5", attempt, mean)
		}
		for q, n := range buckets {
			if frac := float64(n) / samples; frac < 0.23 || frac > 0.27 {
				t.Errorf("attempt %d: quarter %d holds %.3f of the delays, want about 0.25", attempt, q, frac)
			}
		}
	}
}

// TestBackoffSpreadsAFleet: a thousand agents at the same attempt pick
// delays that do not bunch up.
func TestBackoffSpreadsAFleet(t *testing.T) {
	const agents = 1000
	seconds := map[int64]int{}
	for i := 0; i < agents; i++ {
		b := DefaultBackoff(rand.New(rand.NewPCG(uint64(i), 99)))
		seconds[int64(b.Delay(6)/time.Second)]++
	}
	for s, n := range seconds {
		if n > agents/10 {
			t.Errorf("%d of %d agents reconnect in second %d", n, agents, s)
		}
	}
}

type harness struct {
	cp     *cp
	clock  *fakeClock
	status *Status
	runner *runner
	sess   *Session
	cancel context.CancelFunc
	done   chan error
	mu     sync.Mutex
	logs   []string
}

func start(t *testing.T, mod func(*Config)) *harness {
	t.Helper()
	h := &harness{cp: newCP(t), clock: newFakeClock(), status: NewStatus(), runner: newRunner(), done: make(chan error, 1)}
	cfg := Config{
		Client:    func() tetherv1.AgentServiceClient { return h.cp.client },
		Status:    h.status,
		Runner:    h.runner,
		Clock:     h.clock,
		Backoff:   DefaultBackoff(rand.New(rand.NewPCG(5, 6))),
		Version:   "v1.2.3",
		BootID:    "boot-1",
		Uptime:    func() time.Duration { return 42 * time.Second },
		Addresses: func() []string { return []string{"10.0.2.15"} },
		Logf: func(f string, a ...any) {
			h.mu.Lock()
			h.logs = append(h.logs, fmt.Sprintf(f, a...))
			h.mu.Unlock()
		},
	}
	if mod != nil {
		mod(&cfg)
	}
	h.sess = New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.done <- h.sess.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-h.done:
		case <-time.After(10 * time.Second):
			t.Error("session did not stop")
		}
	})
	return h
}

func (h *harness) logged(want string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return strings.Contains(strings.Join(h.logs, "\n"), want)
}

func TestHeartbeats(t *testing.T) {
	h := start(t, nil)
	s := h.cp.nextStream(t)
	hb := s.heartbeat(t)
	if hb.Phase != tetherv1.AgentPhase_AGENT_PHASE_DISCOVERING || hb.AgentVersion != "v1.2.3" || hb.BootId != "boot-1" ||
		hb.UptimeSeconds != 42 || len(hb.Addresses) != 1 || hb.Error != "" {
		t.Fatalf("first heartbeat = %v", hb)
	}
	if s.instance != "i-9" {
		t.Fatalf("stream authenticated as %q", s.instance)
	}
	// Default interval until the control plane says otherwise.
	h.clock.waitFor(t, DefaultHeartbeatInterval)
	s.send <- &tetherv1.ControlMessage{Msg: &tetherv1.ControlMessage_Settings{Settings: &tetherv1.Settings{HeartbeatIntervalSeconds: 7}}}
	h.clock.waitFor(t, 7*time.Second)
	s.quiet(t)
	h.clock.Advance(7 * time.Second)
	s.heartbeat(t)

	// Phase changes and errors go out at once, not at the next tick.
	h.status.SetModules([]string{"sha256:aa"})
	h.status.SetPhase(tetherv1.AgentPhase_AGENT_PHASE_PULLING)
	if hb := s.heartbeat(t); hb.Phase != tetherv1.AgentPhase_AGENT_PHASE_PULLING || hb.RunningModuleDigests[0] != "sha256:aa" {
		t.Fatalf("heartbeat after phase change = %v", hb)
	}
	h.status.SetError(errors.New("module base:1 digest mismatch"))
	if hb := s.heartbeat(t); hb.Error != "module base:1 digest mismatch" {
		t.Fatalf("heartbeat after error = %v", hb)
	}
	h.status.SetPhase(tetherv1.AgentPhase_AGENT_PHASE_PULLING) // no change: no heartbeat
	s.quiet(t)
	if got := h.sess.Settings().HeartbeatInterval; got != 7*time.Second {
		t.Fatalf("settings interval = %v", got)
	}
}

func assign(s *fakeStream, id string, lease time.Duration, now time.Time) {
	a := &tetherv1.TaskAssignment{TaskId: id, Kind: tetherv1.TaskKind_TASK_KIND_EXEC}
	if lease > 0 {
		a.LeaseExpiresAt = timestamppb.New(now.Add(lease))
	}
	s.send <- &tetherv1.ControlMessage{Msg: &tetherv1.ControlMessage_Task{Task: a}}
}

func wantUpdate(t *testing.T, u *tetherv1.TaskUpdate, id string, st tetherv1.TaskStatus) {
	t.Helper()
	if u.TaskId != id || u.Status != st {
		t.Fatalf("update = %v, want %s %v", u, id, st)
	}
}

func TestTaskLeaseAckRenewAndFinish(t *testing.T) {
	h := start(t, nil)
	s := h.cp.nextStream(t)
	s.heartbeat(t)
	assign(s, "t1", 30*time.Second, h.clock.Now())
	wantUpdate(t, s.update(t), "t1", tetherv1.TaskStatus_TASK_STATUS_RUNNING)

	// Renewed every third of the lease.
	h.clock.waitFor(t, 10*time.Second)
	h.clock.Advance(10 * time.Second)
	wantUpdate(t, s.update(t), "t1", tetherv1.TaskStatus_TASK_STATUS_RUNNING)

	// A repeated assignment is acknowledged but does not start it twice.
	assign(s, "t1", 30*time.Second, h.clock.Now())
	wantUpdate(t, s.update(t), "t1", tetherv1.TaskStatus_TASK_STATUS_RUNNING)

	h.runner.ch("t1") <- Outcome{Result: &tetherv1.TaskResult{ExitCode: 0, Output: []byte("hi\n")}}
	u := s.update(t)
	wantUpdate(t, u, "t1", tetherv1.TaskStatus_TASK_STATUS_SUCCEEDED)
	if string(u.Result.GetOutput()) != "hi\n" {
		t.Fatalf("result = %v", u.Result)
	}
	// Assigned again after it finished (our final update was lost): the
	// final update is sent again, the task does not run again.
	assign(s, "t1", 30*time.Second, h.clock.Now())
	wantUpdate(t, s.update(t), "t1", tetherv1.TaskStatus_TASK_STATUS_SUCCEEDED)
	h.runner.mu.Lock()
	defer h.runner.mu.Unlock()
	if h.runner.calls["t1"] != 1 {
		t.Fatalf("task ran %d times", h.runner.calls["t1"])
	}
}

func TestTaskLeaseFromSettings(t *testing.T) {
	h := start(t, nil)
	s := h.cp.nextStream(t)
	s.heartbeat(t)
	s.send <- &tetherv1.ControlMessage{Msg: &tetherv1.ControlMessage_Settings{Settings: &tetherv1.Settings{TaskLeaseSeconds: 45}}}
	// The settings have landed when the heartbeat wait is re-armed for them.
	h.clock.waitForN(t, DefaultHeartbeatInterval, 2)
	assign(s, "t2", 0, h.clock.Now())
	wantUpdate(t, s.update(t), "t2", tetherv1.TaskStatus_TASK_STATUS_RUNNING)
	h.clock.waitFor(t, 15*time.Second)
}

func TestTasksFailCancelAndRunConcurrently(t *testing.T) {
	h := start(t, nil)
	s := h.cp.nextStream(t)
	s.heartbeat(t)
	assign(s, "a", time.Minute, h.clock.Now())
	assign(s, "b", time.Minute, h.clock.Now())
	for _, id := range []string{"a", "b"} {
		select {
		case <-h.runner.started:
		case <-time.After(5 * time.Second):
			t.Fatalf("task %s did not start while the other runs", id)
		}
	}
	got := map[string]tetherv1.TaskStatus{}
	for len(got) < 2 {
		u := s.update(t)
		got[u.TaskId] = u.Status
	}
	s.send <- &tetherv1.ControlMessage{Msg: &tetherv1.ControlMessage_Cancel{Cancel: &tetherv1.TaskCancel{TaskId: "a"}}}
	u := s.update(t)
	wantUpdate(t, u, "a", tetherv1.TaskStatus_TASK_STATUS_CANCELLED)
	h.runner.ch("b") <- Outcome{Err: errors.New("exit status 3"), Result: &tetherv1.TaskResult{ExitCode: 3}}
	u = s.update(t)
	wantUpdate(t, u, "b", tetherv1.TaskStatus_TASK_STATUS_FAILED)
	if u.ErrorMessage != "exit status 3" || u.Result.ExitCode != 3 {
		t.Fatalf("failed update = %v", u)
	}
}

func TestReconnectFlushesQueuedUpdates(t *testing.T) {
	h := start(t, nil)
	s := h.cp.nextStream(t)
	s.heartbeat(t)
	assign(s, "t1", time.Minute, h.clock.Now())
	wantUpdate(t, s.update(t), "t1", tetherv1.TaskStatus_TASK_STATUS_RUNNING)
	// The control plane goes away; the task finishes while cut off.
	s.end <- errors.New("control plane restarting")
	// The agent is backing off with a delay drawn in [0, 500 ms]: it is
	// cut off.
	backoff := h.clock.waitAtMost(t, 500*time.Millisecond)
	if h.sess.Connected() {
		t.Fatal("backing off while connected")
	}
	h.runner.ch("t1") <- Outcome{Result: &tetherv1.TaskResult{Output: []byte("done")}}
	finalQueued := func() bool {
		q := h.sess.queue
		q.mu.Lock()
		defer q.mu.Unlock()
		p := q.pending["t1"]
		return p != nil && p.latest != nil && terminal(p.latest.u.Status)
	}
	// Nobody reads the queue's ready signal while the agent backs off, so
	// the test can wait on it; the next stream flushes the queue anyway.
	deadline := time.After(5 * time.Second)
	for !finalQueued() {
		select {
		case <-h.sess.queue.ready:
		case <-deadline:
			t.Fatal("the final update was never queued")
		}
	}
	if !h.logged("reconnecting in") {
		t.Fatalf("no console line about the reconnect: %v", h.logs)
	}
	h.clock.Advance(backoff)
	s2 := h.cp.nextStream(t)
	s2.heartbeat(t) // heartbeat first, then the queue
	u := s2.update(t)
	wantUpdate(t, u, "t1", tetherv1.TaskStatus_TASK_STATUS_SUCCEEDED)
	if string(u.Result.GetOutput()) != "done" {
		t.Fatalf("flushed update = %v", u)
	}
}

// TestUnconfirmedUpdateIsSentAgain: the stream breaks right after the final
// update went out, before the control plane could confirm it; the agent
// sends it again on the next stream.
func TestUnconfirmedUpdateIsSentAgain(t *testing.T) {
	h := start(t, nil)
	s := h.cp.nextStream(t)
	s.heartbeat(t)
	assign(s, "t1", time.Minute, h.clock.Now())
	wantUpdate(t, s.update(t), "t1", tetherv1.TaskStatus_TASK_STATUS_RUNNING)
	h.runner.ch("t1") <- Outcome{}
	wantUpdate(t, s.update(t), "t1", tetherv1.TaskStatus_TASK_STATUS_SUCCEEDED)
	s.end <- errors.New("crash")
	h.clock.Advance(h.clock.waitAtMost(t, 500*time.Millisecond)) // the first backoff
	s2 := h.cp.nextStream(t)
	s2.heartbeat(t)
	wantUpdate(t, s2.update(t), "t1", tetherv1.TaskStatus_TASK_STATUS_SUCCEEDED)
}

// TestReconnectDrainsGracefully: a requested reconnect half-closes the
// stream; once the control plane ends it, nothing is sent twice.
func TestReconnectDrainsGracefully(t *testing.T) {
	h := start(t, nil)
	s := h.cp.nextStream(t)
	s.heartbeat(t)
	assign(s, "t1", time.Minute, h.clock.Now())
	wantUpdate(t, s.update(t), "t1", tetherv1.TaskStatus_TASK_STATUS_RUNNING)
	h.runner.ch("t1") <- Outcome{}
	wantUpdate(t, s.update(t), "t1", tetherv1.TaskStatus_TASK_STATUS_SUCCEEDED)
	h.sess.Reconnect()
	s2 := h.cp.nextStream(t)
	s2.heartbeat(t)
	s2.quiet(t)
}

func TestThenRunsAfterFinalUpdateIsSent(t *testing.T) {
	h := start(t, nil)
	s := h.cp.nextStream(t)
	s.heartbeat(t)
	assign(s, "reboot", time.Minute, h.clock.Now())
	wantUpdate(t, s.update(t), "reboot", tetherv1.TaskStatus_TASK_STATUS_RUNNING)
	ran := make(chan struct{})
	h.runner.ch("reboot") <- Outcome{Then: func() { close(ran) }}
	wantUpdate(t, s.update(t), "reboot", tetherv1.TaskStatus_TASK_STATUS_SUCCEEDED)
	select {
	case <-ran:
	case <-time.After(5 * time.Second):
		t.Fatal("Then did not run after the final update went out")
	}
}

func TestUpdateQueue(t *testing.T) {
	running := func(id string) *tetherv1.TaskUpdate {
		return &tetherv1.TaskUpdate{TaskId: id, Status: tetherv1.TaskStatus_TASK_STATUS_RUNNING}
	}
	final := func(id string) *tetherv1.TaskUpdate {
		return &tetherv1.TaskUpdate{TaskId: id, Status: tetherv1.TaskStatus_TASK_STATUS_SUCCEEDED}
	}
	drain := func(q *updateQueue) []string {
		var out []string
		for it := q.next(); it != nil; it = q.next() {
			out = append(out, it.u.TaskId+":"+strings.TrimPrefix(it.u.Status.String(), "TASK_STATUS_"))
			if then := q.done(it); then != nil {
				then()
			}
		}
		return out
	}
	tests := []struct {
		name    string
		max     int
		push    []*tetherv1.TaskUpdate
		want    []string
		dropped int
	}{
		{"renewals coalesce behind the ack", 10, []*tetherv1.TaskUpdate{running("a"), running("a"), running("a")}, []string{"a:RUNNING", "a:RUNNING"}, 0},
		{"final keeps the unsent ack", 10, []*tetherv1.TaskUpdate{running("a"), running("a"), final("a")}, []string{"a:RUNNING", "a:SUCCEEDED"}, 0},
		{"tasks keep their order", 10, []*tetherv1.TaskUpdate{running("a"), running("b"), final("a")}, []string{"a:RUNNING", "a:SUCCEEDED", "b:RUNNING"}, 0},
		{"full queue drops renewal-only tasks first", 2, []*tetherv1.TaskUpdate{final("a"), running("b"), running("c")}, []string{"a:SUCCEEDED", "c:RUNNING"}, 1},
		{"full queue of finals drops the oldest", 2, []*tetherv1.TaskUpdate{final("a"), final("b"), final("c")}, []string{"b:SUCCEEDED", "c:SUCCEEDED"}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := newUpdateQueue(tt.max)
			dropped := 0
			for _, u := range tt.push {
				dropped += q.push(u, nil)
			}
			if got := drain(q); strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Fatalf("sent %v, want %v", got, tt.want)
			}
			if dropped != tt.dropped {
				t.Fatalf("dropped %d, want %d", dropped, tt.dropped)
			}
		})
	}
	t.Run("acked task's renewal is not held as an ack", func(t *testing.T) {
		q := newUpdateQueue(10)
		q.push(running("a"), nil)
		drain(q)
		q.push(running("a"), nil)
		q.push(running("a"), nil)
		if got := drain(q); len(got) != 1 {
			t.Fatalf("sent %v, want one renewal", got)
		}
	})
	t.Run("an update pushed again while being sent stays queued", func(t *testing.T) {
		q := newUpdateQueue(10)
		f := final("a")
		q.push(f, nil)
		sending := q.next()
		q.push(f, nil) // the control plane re-assigned the task meanwhile
		q.done(sending)
		if got := drain(q); len(got) != 1 || got[0] != "a:SUCCEEDED" {
			t.Fatalf("after the send completed, queue held %v, want the re-pushed update", got)
		}
	})
	t.Run("callback runs when the final update is sent", func(t *testing.T) {
		q := newUpdateQueue(10)
		called := 0
		q.push(running("a"), nil)
		q.push(final("a"), func() { called++ })
		drain(q)
		if called != 1 {
			t.Fatalf("callback ran %d times", called)
		}
	})
}

func TestPrintable(t *testing.T) {
	for _, tc := range []struct {
		in   string
		max  int
		want string
	}{
		{"plain", 4096, "plain"},
		{"a\nb\x1b]0;title\x07c", 4096, "a b ]0;title c"},
		{"\u0085x\u2028", 4096, " x "},
		{"h\xffi", 4096, "h?i"},
		{"héllo", 2, "h"}, // a cut inside a character drops all of it
		{"héllo", 3, "hé"},
	} {
		if got := printable(tc.in, tc.max); got != tc.want {
			t.Errorf("printable(%q, %d) = %q, want %q", tc.in, tc.max, got, tc.want)
		}
	}
}

// The control plane's reconnection window widens the wait after a lost
// stream when it is longer than the back-off's own step, and a window
// past the agent's bound is cut to it. The back-off here always draws the
// top of its window, so the wait the session arms is the window itself.
func TestReconnectSpreadFromSettings(t *testing.T) {
	for _, tc := range []struct {
		name     string
		spreadMs int32
		want     time.Duration
	}{
		{"none sent", 0, 500 * time.Millisecond},
		{"shorter than the first step", 100, 500 * time.Millisecond},
		{"a large fleet", 38000, 38 * time.Second},
		{"past the agent's bound", 3_600_000, maxReconnectSpread},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, func(c *Config) {
				c.Backoff = Backoff{Base: 500 * time.Millisecond, Cap: 30 * time.Second, Int64N: func(n int64) int64 { return n - 1 }}
			})
			s := h.cp.nextStream(t)
			s.heartbeat(t)
			s.send <- &tetherv1.ControlMessage{Msg: &tetherv1.ControlMessage_Settings{Settings: &tetherv1.Settings{ReconnectSpreadMs: tc.spreadMs}}}
			// The settings have landed when the heartbeat wait is re-armed for them.
			h.clock.waitForN(t, DefaultHeartbeatInterval, 2)
			s.end <- errors.New("control plane restarting")
			h.clock.waitFor(t, tc.want)
			h.clock.Advance(tc.want)
			h.cp.nextStream(t).heartbeat(t)
		})
	}
}

// The window spreads the first attempt after a lost stream only; a failed
// attempt climbs the back-off's own ladder again, up to the window.
func TestDelaySpreadCeilings(t *testing.T) {
	top := func(n int64) int64 { return n - 1 } // the longest delay
	cases := []struct {
		name    string
		attempt int
		spread  time.Duration
		cap     time.Duration
		want    time.Duration
	}{
		{"first attempt, no window", 0, 0, 0, 500 * time.Millisecond},
		{"first attempt spreads over the window", 0, 38 * time.Second, 0, 38 * time.Second},
		{"a window shorter than the step", 0, 100 * time.Millisecond, 0, 500 * time.Millisecond},
		{"a failed attempt retries soon", 1, 38 * time.Second, 0, time.Second},
		{"and climbs", 4, 38 * time.Second, 0, 8 * time.Second},
		{"to the window, past the cap", 7, 38 * time.Second, 0, 38 * time.Second},
		{"a short window keeps the default cap", 9, 2 * time.Second, 0, 30 * time.Second},
		{"a long cap stays", 9, 2 * time.Second, time.Minute, time.Minute},
	}
	for _, c := range cases {
		b := Backoff{Cap: c.cap, Int64N: top}
		if got := b.DelaySpread(c.attempt, c.spread); got != c.want {
			t.Errorf("%s: DelaySpread(%d, %v) at most %v, want %v", c.name, c.attempt, c.spread, got, c.want)
		}
	}
}

// Spread over the window a 19,000-agent tetherd hands out (38 s), the
// reconnections of a fleet that lost it at once hold close to their mean
// rate: no second takes more than twice its share.
func TestDelaySpreadFlattensAStorm(t *testing.T) {
	const agents, spread = 19000, 38 * time.Second
	seconds := map[int64]int{}
	for i := 0; i < agents; i++ {
		b := DefaultBackoff(rand.New(rand.NewPCG(uint64(i), 7)))
		d := b.DelaySpread(0, spread)
		if d < 0 || d > spread {
			t.Fatalf("delay %v outside [0, %v]", d, spread)
		}
		seconds[int64(d/time.Second)]++
	}
	mean := float64(agents) / spread.Seconds()
	for s, n := range seconds {
		if float64(n) > 2*mean {
			t.Errorf("second %d holds %d reconnections, mean %.0f", s, n, mean)
		}
	}
}

// A trust bundle on the stream goes to OnTrustBundle, and the stream
// carries on.
func TestTrustBundleIsHandedOn(t *testing.T) {
	got := make(chan *tetherv1.TrustBundle, 1)
	h := start(t, func(c *Config) { c.OnTrustBundle = func(b *tetherv1.TrustBundle) { got <- b } })
	s := h.cp.nextStream(t)
	s.heartbeat(t)
	s.send <- &tetherv1.ControlMessage{Msg: &tetherv1.ControlMessage_TrustBundle{TrustBundle: &tetherv1.TrustBundle{ActiveFingerprint: "sha256:ab"}}}
	select {
	case b := <-got:
		if b.ActiveFingerprint != "sha256:ab" {
			t.Fatalf("bundle = %v", b)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the bundle never reached OnTrustBundle")
	}
	h.status.SetPhase(tetherv1.AgentPhase_AGENT_PHASE_PULLING)
	if hb := s.heartbeat(t); hb.Phase != tetherv1.AgentPhase_AGENT_PHASE_PULLING {
		t.Fatalf("heartbeat after the bundle = %v", hb)
	}
}
