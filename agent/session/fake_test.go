package session

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tetherfleet/tether/agent/enroll"
	"github.com/tetherfleet/tether/agent/enroll/enrolltest"
	"github.com/tetherfleet/tether/internal/clock"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// fakeClock is internal/clock's fake with the waits these tests assert:
// how long the session chose to wait, not only that it waits.
type fakeClock struct{ *clock.Fake }

func newFakeClock() *fakeClock { return &fakeClock{clock.NewFake(time.Now())} }

// await blocks until ok holds for the pending waits, failing t after 10 s.
func (c *fakeClock) await(t *testing.T, what string, ok func(pending []time.Duration) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.BlockUntilPending(ctx, ok); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// waitFor blocks until someone waits for exactly d.
func (c *fakeClock) waitFor(t *testing.T, d time.Duration) {
	t.Helper()
	c.waitForN(t, d, 1)
}

// waitForN blocks until n pending waits are for exactly d.
func (c *fakeClock) waitForN(t *testing.T, d time.Duration, n int) {
	t.Helper()
	c.await(t, fmt.Sprintf("fewer than %d waits for %v", n, d), func(ds []time.Duration) bool {
		k := 0
		for _, w := range ds {
			if w == d {
				k++
			}
		}
		return k >= n
	})
}

// waitAtMost blocks until someone waits for at most d and returns that wait.
func (c *fakeClock) waitAtMost(t *testing.T, d time.Duration) time.Duration {
	t.Helper()
	var got time.Duration
	c.await(t, fmt.Sprintf("nobody waited for at most %v", d), func(ds []time.Duration) bool {
		for _, w := range ds {
			if w <= d {
				got = w
				return true
			}
		}
		return false
	})
	return got
}

// cp is a scripted control plane: every stream the agent opens shows up on
// streams; the test reads what the agent sent and sends its own messages.
type cp struct {
	srv     *enrolltest.Server
	client  tetherv1.AgentServiceClient
	streams chan *fakeStream
}

type fakeStream struct {
	instance string
	recv     chan *tetherv1.AgentMessage
	send     chan *tetherv1.ControlMessage
	end      chan error
}

func newCP(t *testing.T) *cp {
	t.Helper()
	ca := enrolltest.NewCA(t, "ca")
	srv := enrolltest.Start(t, ca)
	c := &cp{srv: srv, streams: make(chan *fakeStream, 10)}
	srv.ConnectHandler = func(inst string, st tetherv1.AgentService_ConnectServer) error {
		fs := &fakeStream{instance: inst, recv: make(chan *tetherv1.AgentMessage, 100), send: make(chan *tetherv1.ControlMessage, 100), end: make(chan error, 1)}
		c.streams <- fs
		eof := make(chan struct{})
		go func() {
			defer close(fs.recv)
			defer close(eof)
			for {
				m, err := st.Recv()
				if err != nil {
					return
				}
				fs.recv <- m
			}
		}()
		for {
			select {
			case <-eof:
				// Like the real control plane: the agent's half-close ends
				// the stream once everything before it has been read.
				return nil
			case m := <-fs.send:
				if err := st.Send(m); err != nil {
					return err
				}
			case err := <-fs.end:
				return err
			case <-st.Context().Done():
				return nil
			}
		}
	}
	m, err := enroll.New(enroll.Config{StateDir: filepath.Join(t.TempDir(), "state"), URL: srv.URL, CAFingerprint: ca.Fingerprint})
	if err != nil {
		t.Fatal(err)
	}
	ec, _ := m.Dial(false)
	defer ec.Close()
	if _, err := m.Enroll(context.Background(), tetherv1.NewEnrollmentServiceClient(ec), srv.AddToken("i-9")); err != nil {
		t.Fatal(err)
	}
	conn, _ := m.Dial(true)
	t.Cleanup(func() { conn.Close() })
	c.client = tetherv1.NewAgentServiceClient(conn)
	return c
}

func (c *cp) nextStream(t *testing.T) *fakeStream {
	t.Helper()
	select {
	case s := <-c.streams:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("the agent did not open a stream")
		return nil
	}
}

func (s *fakeStream) next(t *testing.T) *tetherv1.AgentMessage {
	t.Helper()
	select {
	case m, ok := <-s.recv:
		if !ok {
			t.Fatal("stream closed")
		}
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("nothing received from the agent")
		return nil
	}
}

func (s *fakeStream) heartbeat(t *testing.T) *tetherv1.Heartbeat {
	t.Helper()
	m := s.next(t)
	hb := m.GetHeartbeat()
	if hb == nil {
		t.Fatalf("got %v, want a heartbeat", m)
	}
	return hb
}

// update skips heartbeats and returns the next task update.
func (s *fakeStream) update(t *testing.T) *tetherv1.TaskUpdate {
	t.Helper()
	for {
		m := s.next(t)
		if u := m.GetTaskUpdate(); u != nil {
			return u
		}
	}
}

// quiet checks that nothing arrives for a moment.
func (s *fakeStream) quiet(t *testing.T) {
	t.Helper()
	select {
	case m := <-s.recv:
		t.Fatalf("unexpected message %v", m)
	case <-time.After(100 * time.Millisecond):
	}
}

// runner is a scripted task runner: each task waits for its outcome on a
// channel the test owns.
type runner struct {
	mu      sync.Mutex
	calls   map[string]int
	outcome map[string]chan Outcome
	started chan string
}

func newRunner() *runner {
	return &runner{calls: map[string]int{}, outcome: map[string]chan Outcome{}, started: make(chan string, 100)}
}

func (r *runner) ch(id string) chan Outcome {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.outcome[id] == nil {
		r.outcome[id] = make(chan Outcome, 1)
	}
	return r.outcome[id]
}

func (r *runner) Run(ctx context.Context, a *tetherv1.TaskAssignment, _ Settings) Outcome {
	r.mu.Lock()
	r.calls[a.TaskId]++
	r.mu.Unlock()
	r.started <- a.TaskId
	select {
	case o := <-r.ch(a.TaskId):
		return o
	case <-ctx.Done():
		return Outcome{Err: errors.New("stopped")}
	}
}
