package bench

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/agent/enroll"
	"github.com/tetherfleet/tether/agent/session"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// FleetOptions shape a simulated fleet: N agents, each with its own
// enrolled identity, TLS connection and Connect stream, heartbeating on
// the real schedule.
type FleetOptions struct {
	Agents int
	// Offset is this shard's first agent number in the whole fleet; it
	// picks the agents' source addresses so shards spread over them too.
	Offset int
	// EnrollRate bounds how many agents per second are brought up
	// (enrolled, or connected with a known identity; 0: unbounded).
	EnrollRate float64
	// Heartbeat is each agent's interval, jittered by ±Jitter (a
	// fraction; default 0.1). The first falls at a random point of the
	// first interval, as agents booted at different times would.
	// Zero: only the heartbeat sent on connecting (an idle fleet).
	Heartbeat time.Duration
	Jitter    float64
	// Sources are the loopback source addresses agents bind to, agent i
	// using Sources[(Offset+i) % len]; none: the kernel's choice.
	Sources []net.IP
	// Dial opens an agent's own connection from src with its certificate.
	Dial   func(src net.IP, cert *tls.Certificate) (*grpc.ClientConn, error)
	Admin  v1.AdminServiceClient
	Enroll v1.EnrollmentServiceClient
	// EnrollFrom, when set, is the enrollment client bound to a source
	// address: tetherd rate-limits enrollment per source (20/s), and a
	// real fleet enrolls from as many addresses as it has machines.
	EnrollFrom func(src net.IP) v1.EnrollmentServiceClient
	// Node is what the agents' instances are provisioned from.
	Node string
	// Workers enroll in parallel (default 16).
	Workers int
	// Known are identities enrolled by an earlier run, used first; the
	// rest are enrolled and, if Save is set, handed to it.
	Known []*SimAgent
	Save  func(*SimAgent) error
	// Backoff spaces an agent's reconnections, as the real agent's
	// session does (default: session.DefaultBackoff, 500 ms doubling to
	// 30 s, full jitter). An agent whose stream stayed up for
	// HealthyAfter (default 1 minute, the agent's) starts over from the
	// first step.
	Backoff      session.Backoff
	HealthyAfter time.Duration
	// Now is the clock of the timeline (default time.Now).
	Now func() time.Time
	// MaxConnecting bounds this process's agents that are opening a
	// stream at once (dial, TLS handshake, first message; 0: no bound).
	// Real agents each handshake on their own machine; thousands of
	// simulated ones sharing a core slow each other's handshakes past the
	// server's deadline and fail attempts a real fleet would not. The
	// bound keeps that contention out of what a storm measures.
	MaxConnecting int
	// Progress, if set, is called after every heartbeat sent and every
	// stream accepted, so a caller can wait on the fleet's counts without
	// polling them. It must not block.
	Progress func()
}

// Fleet is a running simulated fleet.
type Fleet struct {
	o         FleetOptions
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	connected atomic.Int64
	enrolled  atomic.Int64
	reused    atomic.Int64
	sent      atomic.Int64
	errs      atomic.Int64
	reconnect atomic.Int64
	// connecting holds a token per agent opening a stream (MaxConnecting);
	// nil: no bound.
	connecting chan struct{}
	mu         sync.Mutex
	firstErrs  []string
	causes     map[string]int64
	timeline   map[int64]*Second
	agents     []*SimAgent
	// waiting maps an instance to the probe awaiting its next task.
	waiting sync.Map
}

// Second is what the fleet saw in one wall-clock second.
type Second struct {
	Unix int64 `json:"unix"`
	// Connects are streams the server accepted (its first message
	// arrived); Reconnects are those of them that replaced a lost stream.
	Connects   int `json:"connects"`
	Reconnects int `json:"reconnects"`
	// Failures are attempts or streams that ended in an error.
	Failures int `json:"failures"`
}

// FleetStats is a shard's counts.
type FleetStats struct {
	Agents     int      `json:"agents"`
	Enrolled   int64    `json:"enrolled"`
	Reused     int64    `json:"reused_identities"`
	Connected  int64    `json:"connected"`
	Sent       int64    `json:"heartbeats_sent"`
	Errors     int64    `json:"errors"`
	Reconnects int64    `json:"reconnects"`
	FirstErrs  []string `json:"first_errors,omitempty"`
	// Causes counts the errors by FailureCause.
	Causes   map[string]int64 `json:"failures_by_cause,omitempty"`
	Timeline []Second         `json:"timeline,omitempty"`
}

// Add sums another shard's counts into s; timelines merge by second.
func (s *FleetStats) Add(o FleetStats) {
	s.Agents += o.Agents
	s.Enrolled += o.Enrolled
	s.Reused += o.Reused
	s.Connected += o.Connected
	s.Sent += o.Sent
	s.Errors += o.Errors
	s.Reconnects += o.Reconnects
	for _, e := range o.FirstErrs {
		if len(s.FirstErrs) < 5 {
			s.FirstErrs = append(s.FirstErrs, e)
		}
	}
	for k, v := range o.Causes {
		if s.Causes == nil {
			s.Causes = map[string]int64{}
		}
		s.Causes[k] += v
	}
	s.Timeline = MergeTimelines(s.Timeline, o.Timeline)
}

// MergeTimelines sums two timelines second by second, in time order.
func MergeTimelines(a, b []Second) []Second {
	by := map[int64]*Second{}
	for _, tl := range [][]Second{a, b} {
		for _, x := range tl {
			cur := by[x.Unix]
			if cur == nil {
				cur = &Second{Unix: x.Unix}
				by[x.Unix] = cur
			}
			cur.Connects += x.Connects
			cur.Reconnects += x.Reconnects
			cur.Failures += x.Failures
		}
	}
	return sortedSeconds(by)
}

func sortedSeconds(by map[int64]*Second) []Second {
	out := make([]Second, 0, len(by))
	for _, x := range by {
		out = append(out, *x)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Unix < out[j].Unix })
	return out
}

// StartFleet brings the agents up at the bounded rate (known identities
// first, then fresh enrollments) and returns once each has been tried;
// they run until Stop. A failed enrollment is counted, not fatal: a fleet
// run reports its errors.
func StartFleet(ctx context.Context, o FleetOptions) *Fleet {
	if o.Workers <= 0 {
		o.Workers = 16
	}
	if o.Jitter <= 0 {
		o.Jitter = 0.1
	}
	if o.Backoff.Base == 0 {
		o.Backoff = session.DefaultBackoff(nil)
	}
	if o.HealthyAfter <= 0 {
		o.HealthyAfter = time.Minute
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	fctx, cancel := context.WithCancel(ctx)
	f := &Fleet{o: o, ctx: fctx, cancel: cancel, timeline: map[int64]*Second{}}
	if o.MaxConnecting > 0 {
		f.connecting = make(chan struct{}, o.MaxConnecting)
	}
	jobs := make(chan int)
	var enrolling sync.WaitGroup
	for w := 0; w < o.Workers; w++ {
		enrolling.Add(1)
		go func() {
			defer enrolling.Done()
			for i := range jobs {
				var src net.IP
				if len(o.Sources) > 0 {
					src = o.Sources[(o.Offset+i)%len(o.Sources)]
				}
				a, err := f.identity(i, src)
				if err != nil {
					f.fail(fmt.Errorf("enroll agent %d: %w", o.Offset+i, err))
					continue
				}
				f.mu.Lock()
				f.agents = append(f.agents, a)
				f.mu.Unlock()
				f.wg.Add(1)
				go f.run(a, src)
			}
		}()
	}
	var tick *time.Ticker
	if o.EnrollRate > 0 {
		tick = time.NewTicker(time.Duration(float64(time.Second) / o.EnrollRate))
		defer tick.Stop()
	}
	for i := 0; i < o.Agents && fctx.Err() == nil; i++ {
		if tick != nil {
			select {
			case <-tick.C:
			case <-fctx.Done():
			}
		}
		select {
		case jobs <- i:
		case <-fctx.Done():
		}
	}
	close(jobs)
	enrolling.Wait()
	return f
}

// identity is agent i's known identity, or a fresh enrollment (saved).
// A failure the real agent retries (enroll.Transient) is counted as a
// failed attempt and retried after a pause, as the agent does; any other
// error, or the 20th attempt, is the agent's failure.
func (f *Fleet) identity(i int, src net.IP) (*SimAgent, error) {
	if i < len(f.o.Known) {
		f.reused.Add(1)
		k := f.o.Known[i]
		return &SimAgent{InstanceID: k.InstanceID, Cert: k.Cert}, nil
	}
	client := f.o.Enroll
	if f.o.EnrollFrom != nil {
		client = f.o.EnrollFrom(src)
	}
	a, err := enrollOne(f.ctx, f.o.Admin, client, f.o.Node, func(attempt int, err error) bool {
		if !enroll.Transient(err) || attempt >= 20 {
			return false
		}
		if status.Code(err) != codes.ResourceExhausted {
			// A refusal for the rate is the limit working, not a failure.
			f.fail(fmt.Errorf("enroll agent %d (attempt %d, retried): %w", f.o.Offset+i, attempt+1, err))
		}
		select {
		case <-f.ctx.Done():
			return false
		case <-time.After(f.o.Backoff.Delay(attempt) + time.Second):
			return true
		}
	})
	if err != nil {
		return nil, err
	}
	f.enrolled.Add(1)
	if f.o.Save != nil {
		if err := f.o.Save(a); err != nil {
			return nil, err
		}
	}
	return a, nil
}

func (f *Fleet) fail(err error) {
	if f.ctx.Err() != nil {
		return // stopping: a cut stream is expected
	}
	f.errs.Add(1)
	f.mu.Lock()
	if len(f.firstErrs) < 5 {
		f.firstErrs = append(f.firstErrs, err.Error())
	}
	if f.causes == nil {
		f.causes = map[string]int64{}
	}
	f.causes[FailureCause(err)]++
	f.second().Failures++
	f.mu.Unlock()
}

// second is the timeline's entry for now; f.mu is held.
func (f *Fleet) second() *Second {
	u := f.o.Now().Unix()
	s := f.timeline[u]
	if s == nil {
		s = &Second{Unix: u}
		f.timeline[u] = s
	}
	return s
}

// run keeps one agent connected, reconnecting with the agent's own
// full-jitter backoff, spread over the window the control plane last
// asked for, until the fleet stops.
func (f *Fleet) run(a *SimAgent, src net.IP) {
	defer f.wg.Done()
	attempt, lost := 0, false
	for {
		start := f.o.Now()
		established, err := f.session(a, src, lost)
		if f.ctx.Err() != nil {
			return
		}
		f.fail(fmt.Errorf("agent %s: %w", a.InstanceID, err))
		if established {
			lost = true
			if f.o.Now().Sub(start) >= f.o.HealthyAfter {
				attempt = 0
			}
		}
		// As the real agent: the control plane's reconnection window
		// spreads the first attempt after a lost stream, and a failed
		// attempt climbs the back-off (agent/session.Backoff.DelaySpread).
		d := f.o.Backoff.DelaySpread(attempt, time.Duration(a.spread.Load()))
		attempt++
		select {
		case <-f.ctx.Done():
			return
		case <-time.After(d):
		}
	}
}

// startConnecting takes a place among the agents opening a stream
// (MaxConnecting). release gives it back; calling it again does nothing.
func (f *Fleet) startConnecting() (release func(), err error) {
	if f.connecting == nil {
		return func() {}, nil
	}
	select {
	case f.connecting <- struct{}{}:
	case <-f.ctx.Done():
		return nil, f.ctx.Err()
	}
	var once sync.Once
	return func() { once.Do(func() { <-f.connecting }) }, nil
}

// errLost marks an error that ended an established stream, as against
// one that failed an attempt to open one.
var errLost = errors.New("stream lost")

// FailureCause sorts an error into a few kinds for the report: whether
// it ended a stream or failed an attempt, and what the transport said.
// A storm's failures say where reconnections were lost (refused at the
// port, a handshake past its deadline, a reset) without reading logs.
func FailureCause(err error) string {
	phase := "attempt"
	if errors.Is(err, errLost) {
		phase = "stream lost"
	}
	msg := err.Error()
	for _, c := range []struct{ needle, cause string }{
		{"connection refused", "connection refused"},
		{"connection reset", "connection reset"},
		{"broken pipe", "broken pipe"},
		{"server preface", "no HTTP/2 preface from the server"},
		{"handshake", "TLS handshake failed"},
		{"i/o timeout", "timeout"},
		{"DeadlineExceeded", "timeout"},
		{"EOF", "EOF"},
	} {
		if strings.Contains(msg, c.needle) {
			return phase + ": " + c.cause
		}
	}
	if st, ok := status.FromError(err); ok && st.Code() != codes.Unknown {
		return phase + ": " + st.Code().String()
	}
	return phase + ": other"
}

// learn keeps the reconnection window of a Settings message, as the real
// agent does; the control plane resends settings as its fleet grows.
func (a *SimAgent) learn(m *v1.ControlMessage) {
	if ms := m.GetSettings().GetReconnectSpreadMs(); ms > 0 {
		a.spread.Store(int64(time.Duration(ms) * time.Millisecond))
	}
}

// session runs one stream until it breaks; established says the server
// accepted it (its first message arrived). reconnect marks a stream
// that replaces a lost one.
func (f *Fleet) session(a *SimAgent, src net.IP, reconnect bool) (established bool, err error) {
	release, err := f.startConnecting()
	if err != nil {
		return false, err
	}
	defer release()
	conn, err := f.o.Dial(src, &a.Cert)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	s, err := v1.NewAgentServiceClient(conn).Connect(sctx)
	if err != nil {
		return false, err
	}
	a.sendMu.Lock()
	a.conn, a.stream = conn, s
	a.sendMu.Unlock()
	if err := a.Heartbeat(v1.AgentPhase_AGENT_PHASE_READY); err != nil {
		return false, err
	}
	f.sent.Add(1)
	// The server sends its settings first: that is the stream accepted.
	first, err := s.Recv()
	if err != nil {
		return false, fmt.Errorf("stream: %w", err)
	}
	a.learn(first)
	release()
	f.connected.Add(1)
	defer f.connected.Add(-1)
	f.progress()
	a.online.Store(true)
	defer a.online.Store(false)
	f.mu.Lock()
	sec := f.second()
	sec.Connects++
	if reconnect {
		sec.Reconnects++
		f.reconnect.Add(1)
	}
	f.mu.Unlock()
	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := s.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			a.learn(m)
			if t := m.GetTask(); t != nil {
				if ch, ok := f.waiting.Load(a.InstanceID); ok {
					select {
					case ch.(chan time.Time) <- f.o.Now():
					default:
					}
				}
				_ = a.Finish(t.TaskId) // a failed send shows up as a Recv error
			}
		}
	}()
	var next <-chan time.Time
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	if f.o.Heartbeat > 0 {
		timer.Reset(rand.N(f.o.Heartbeat) + 1)
		next = timer.C
	}
	for {
		select {
		case <-f.ctx.Done():
			_ = s.CloseSend()
			return true, nil
		case err := <-recvErr:
			return true, fmt.Errorf("%w: %w", errLost, err)
		case <-next:
			if err := a.Heartbeat(v1.AgentPhase_AGENT_PHASE_READY); err != nil {
				return true, fmt.Errorf("%w: heartbeat: %w", errLost, err)
			}
			f.sent.Add(1)
			f.progress()
			j := 1 + f.o.Jitter*(2*rand.Float64()-1)
			timer.Reset(time.Duration(float64(f.o.Heartbeat) * j))
		}
	}
}

// progress tells FleetOptions.Progress that a count moved.
func (f *Fleet) progress() {
	if f.o.Progress != nil {
		f.o.Progress()
	}
}

// Connected is the agents whose stream is open now.
func (f *Fleet) Connected() int { return int(f.connected.Load()) }

// Stats snapshots the counts.
func (f *Fleet) Stats() FleetStats {
	f.mu.Lock()
	errs := append([]string(nil), f.firstErrs...)
	causes := make(map[string]int64, len(f.causes))
	for k, v := range f.causes {
		causes[k] = v
	}
	tl := sortedSeconds(f.timeline)
	f.mu.Unlock()
	return FleetStats{Agents: f.o.Agents, Enrolled: f.enrolled.Load(), Reused: f.reused.Load(), Connected: f.connected.Load(),
		Sent: f.sent.Load(), Errors: f.errs.Load(), Reconnects: f.reconnect.Load(), FirstErrs: errs, Causes: causes, Timeline: tl}
}

// Stop ends every stream and waits for the agents to go.
func (f *Fleet) Stop() {
	f.cancel()
	f.wg.Wait()
}

// PushProbe creates n exec tasks, one at a time, each for a random
// connected agent of this fleet, and measures from just before CreateTask
// to the task arriving on that agent's stream (docs/reliability.md: task
// create -> agent receives).
func (f *Fleet) PushProbe(ctx context.Context, n int) (lat []time.Duration, errs int, firstErr error) {
	f.mu.Lock()
	agents := append([]*SimAgent(nil), f.agents...)
	f.mu.Unlock()
	miss := func(err error) {
		errs++
		if firstErr == nil {
			firstErr = err
		}
	}
	for i := 0; i < n && len(agents) > 0 && ctx.Err() == nil; i++ {
		a := agents[rand.N(len(agents))]
		if !a.online.Load() {
			i-- // pick another; the probe measures delivery, not reconnection
			continue
		}
		ch := make(chan time.Time, 1)
		f.waiting.Store(a.InstanceID, ch)
		t0 := f.o.Now()
		_, err := f.o.Admin.CreateTask(ctx, &v1.CreateTaskRequest{InstanceId: a.InstanceID, Kind: v1.TaskKind_TASK_KIND_EXEC,
			Exec: &v1.ExecPayload{Argv: []string{"true"}}})
		if err != nil {
			f.waiting.Delete(a.InstanceID)
			miss(fmt.Errorf("create task for %s: %w", a.InstanceID, err))
			continue
		}
		select {
		case t1 := <-ch:
			lat = append(lat, t1.Sub(t0))
		case <-time.After(10 * time.Second):
			miss(fmt.Errorf("task for %s did not arrive within 10 s", a.InstanceID))
		case <-ctx.Done():
		}
		f.waiting.Delete(a.InstanceID)
	}
	return lat, errs, firstErr
}
