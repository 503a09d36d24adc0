// Package session keeps the agent's one long-lived stream to the control
// plane (AgentService.Connect): it sends a heartbeat as soon as the stream
// opens, again at the interval the control plane sets and at every phase
// change; it runs the tasks the control plane pushes, acknowledging and
// renewing their leases; and it reconnects with jittered exponential
// backoff, holding task updates until the stream is back.
//
// The protocol, as the agent speaks it:
//
//   - agent → Heartbeat, immediately after the stream opens; then every
//     Settings.heartbeat_interval_seconds (default 30 s) and at once on any
//     phase or error change.
//   - control plane → Settings, whenever it likes (usually first).
//   - control plane → TaskAssignment: the agent answers TaskUpdate{RUNNING}
//     at once (this acknowledges the lease), repeats RUNNING every third of
//     the lease (lease_expires_at − now, else Settings.task_lease_seconds),
//     and ends with one TaskUpdate of SUCCEEDED or FAILED (with result and
//     error_message) or CANCELLED. A repeated assignment of a task that is
//     still running is answered with RUNNING and does not start it twice; a
//     repeated assignment of a task that just finished gets its final update
//     again.
//   - control plane → TaskCancel: the task's context is cancelled and it
//     ends CANCELLED.
//
// Updates are at least once: the queued ones are sent after a reconnect,
// and so again is the last update of each task sent on a stream that broke
// before the control plane confirmed it (by ending the stream after the
// agent's half-close). The control plane must take a repeated final update
// of a finished task as a no-op.
package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/tetherfleet/tether/internal/clock"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// Settings are the control plane's instructions, with defaults filled in.
type Settings struct {
	HeartbeatInterval  time.Duration
	TaskLease          time.Duration
	MaxTaskOutputBytes int
	// ReconnectSpread is the window the control plane asks reconnections
	// to be spread over (zero until it says).
	ReconnectSpread time.Duration
}

// Defaults used until the control plane says otherwise.
const (
	DefaultHeartbeatInterval  = 30 * time.Second
	DefaultTaskLease          = 90 * time.Second
	DefaultMaxTaskOutputBytes = 64 << 10
	// minInterval keeps a misconfigured control plane from making the
	// agent spin.
	minInterval = time.Second
	// maxReconnectSpread keeps a misconfigured control plane from parking
	// its agents for long after a restart.
	maxReconnectSpread = 2 * time.Minute
)

// DefaultSettings are in force before the first Settings message.
func DefaultSettings() Settings {
	return Settings{HeartbeatInterval: DefaultHeartbeatInterval, TaskLease: DefaultTaskLease, MaxTaskOutputBytes: DefaultMaxTaskOutputBytes}
}

func settingsFrom(m *tetherv1.Settings) Settings {
	s := DefaultSettings()
	if v := m.GetHeartbeatIntervalSeconds(); v > 0 {
		s.HeartbeatInterval = max(time.Duration(v)*time.Second, minInterval)
	}
	if v := m.GetTaskLeaseSeconds(); v > 0 {
		s.TaskLease = max(time.Duration(v)*time.Second, 3*minInterval)
	}
	if v := m.GetMaxTaskOutputBytes(); v > 0 {
		s.MaxTaskOutputBytes = int(v)
	}
	if v := m.GetReconnectSpreadMs(); v > 0 {
		s.ReconnectSpread = min(time.Duration(v)*time.Millisecond, maxReconnectSpread)
	}
	return s
}

// Outcome is how a task ended.
type Outcome struct {
	Result *tetherv1.TaskResult
	// Err fails the task; its text becomes error_message.
	Err error
	// Then runs once the final update has been sent (or after a grace
	// period if it cannot be): a reboot must be reported before it happens,
	// or the control plane would lease it again to the next boot.
	Then func()
}

// Runner executes tasks. ctx is cancelled when the control plane cancels
// the task; the runner then returns promptly.
type Runner interface {
	Run(ctx context.Context, task *tetherv1.TaskAssignment, s Settings) Outcome
}

// Config configures a Session.
type Config struct {
	// Client returns a client on the current mTLS connection.
	Client  func() tetherv1.AgentServiceClient
	Status  *Status
	Runner  Runner
	Clock   clock.Clock
	Backoff Backoff
	// HealthyAfter is how long a stream must stay up for the backoff to
	// start again from the first step (default 60 s).
	HealthyAfter time.Duration
	// QueueSize bounds the tasks with updates waiting to be sent (default 256).
	QueueSize int
	// ThenGrace bounds how long an Outcome.Then waits for its update to be
	// sent (default 10 s).
	ThenGrace time.Duration
	// DrainTimeout bounds the wait for the control plane to end a stream
	// the agent half-closed (default 5 s).
	DrainTimeout time.Duration

	Version   string
	BootID    string
	Uptime    func() time.Duration
	Addresses func() []string
	Logf      func(format string, args ...any)
	// OnSettings is told about every Settings message.
	OnSettings func(Settings)
	// OnTrustBundle is told about every trust bundle (design §3.10). It
	// runs on the receiving goroutine and must not block for long.
	OnTrustBundle func(*tetherv1.TrustBundle)
}

// Session is the agent's end of the Connect stream.
type Session struct {
	cfg   Config
	queue *updateQueue

	mu       sync.Mutex
	settings Settings
	running  map[string]context.CancelCauseFunc
	finished map[string]*tetherv1.TaskUpdate
	// finishedOrder bounds finished.
	finishedOrder []string
	connected     bool
	// sentGen is the Status generation of the last heartbeat sent; sentCh
	// is closed and replaced each time it moves.
	sentGen uint64
	sentCh  chan struct{}

	settingsCh  chan struct{}
	reconnectCh chan struct{}
	// closeCh asks the stream to end cleanly; drained is closed once it has.
	closeCh   chan struct{}
	closeOnce sync.Once
	drained   chan struct{}
	// stopped is closed when Run returns.
	stopped chan struct{}
	// base is Run's context: tasks outlive a stream but not the session.
	base  context.Context
	tasks sync.WaitGroup
}

// New fills in defaults.
func New(cfg Config) *Session {
	if cfg.Status == nil {
		cfg.Status = NewStatus()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.HealthyAfter == 0 {
		cfg.HealthyAfter = time.Minute
	}
	if cfg.QueueSize == 0 {
		cfg.QueueSize = 256
	}
	if cfg.ThenGrace == 0 {
		cfg.ThenGrace = 10 * time.Second
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 5 * time.Second
	}
	if cfg.Uptime == nil {
		start := cfg.Clock.Now()
		cfg.Uptime = func() time.Duration { return cfg.Clock.Now().Sub(start) }
	}
	if cfg.Addresses == nil {
		cfg.Addresses = func() []string { return nil }
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	return &Session{
		cfg:         cfg,
		queue:       newUpdateQueue(cfg.QueueSize),
		settings:    DefaultSettings(),
		running:     map[string]context.CancelCauseFunc{},
		finished:    map[string]*tetherv1.TaskUpdate{},
		settingsCh:  make(chan struct{}, 1),
		reconnectCh: make(chan struct{}, 1),
		sentCh:      make(chan struct{}),
		closeCh:     make(chan struct{}),
		drained:     make(chan struct{}),
		stopped:     make(chan struct{}),
	}
}

var errClosed = errors.New("session closed")

// Close ends the stream cleanly and stops reconnecting: it half-closes the
// stream and waits (up to timeout) for the control plane to end it, which
// tells the agent that everything it sent has been read. The agent calls
// it before exec'ing the new root's init, which would otherwise cut the
// stream with the last heartbeat possibly still in a buffer. It reports
// whether the control plane confirmed.
func (s *Session) Close(timeout time.Duration) bool {
	s.closeOnce.Do(func() { close(s.closeCh) })
	select {
	case <-s.drained:
		return true
	case <-s.stopped:
		select {
		case <-s.drained:
			return true
		default:
			return false
		}
	case <-s.cfg.Clock.After(timeout):
		return false
	}
}

// WaitSent waits until a heartbeat reflecting every status change made so
// far has been sent, ctx ends, or timeout passes; it reports whether it was
// sent. The agent uses it before an exec or exit that would cut the stream.
func (s *Session) WaitSent(ctx context.Context, timeout time.Duration) bool {
	want := s.cfg.Status.generation()
	deadline := s.cfg.Clock.After(timeout)
	for {
		s.mu.Lock()
		got, ch := s.sentGen, s.sentCh
		s.mu.Unlock()
		if got >= want {
			return true
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		case <-deadline:
			return false
		}
	}
}

// Settings returns the settings in force.
func (s *Session) Settings() Settings {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.settings
}

// Connected reports whether a stream is open.
func (s *Session) Connected() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.connected
}

// Reconnect closes the current stream and opens a new one at once, without
// backoff: the agent calls it after renewing its certificate so the control
// plane sees the new one.
func (s *Session) Reconnect() {
	select {
	case s.reconnectCh <- struct{}{}:
	default:
	}
}

var errReconnect = errors.New("reconnect requested")

// Run keeps the stream open until ctx ends, then waits for running tasks to
// notice the cancellation.
func (s *Session) Run(ctx context.Context) error {
	s.mu.Lock()
	s.base = ctx
	s.mu.Unlock()
	defer close(s.stopped)
	defer s.tasks.Wait()
	attempt := 0
	for {
		start := s.cfg.Clock.Now()
		established, err := s.runStream(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, errClosed) {
			return nil
		}
		if errors.Is(err, errReconnect) {
			attempt = 0
			continue
		}
		if established && s.cfg.Clock.Now().Sub(start) >= s.cfg.HealthyAfter {
			attempt = 0
		}
		d := s.cfg.Backoff.DelaySpread(attempt, s.Settings().ReconnectSpread)
		attempt++
		s.cfg.Logf("control plane stream lost: %v; reconnecting in %s (tasks keep running; their updates are queued)", err, d.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.closeCh:
			return nil
		case <-s.cfg.Clock.After(d):
		case <-s.reconnectCh:
		}
	}
}

func (s *Session) setConnected(v bool) {
	s.mu.Lock()
	s.connected = v
	s.mu.Unlock()
}

// runStream runs one stream until it breaks. established says a first
// heartbeat went out.
func (s *Session) runStream(ctx context.Context) (established bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := s.cfg.Client().Connect(ctx)
	if err != nil {
		return false, fmt.Errorf("open stream: %w", err)
	}
	// The first heartbeat carries every change made so far.
	select {
	case <-s.cfg.Status.changed:
	default:
	}
	if err := s.sendHeartbeat(stream); err != nil {
		return false, err
	}
	s.setConnected(true)
	defer s.setConnected(false)

	recvErr := make(chan error, 1)
	go func() {
		for {
			msg, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			s.handle(msg)
		}
	}()

	// inflight holds, per task, the last update sent on this stream. Send
	// returning means only that gRPC buffered it: if the stream breaks
	// before the control plane confirms (by ending the stream after our
	// half-close), these are sent again on the next stream. The control
	// plane ignores a repeated report of a finished task.
	inflight := map[string]*tetherv1.TaskUpdate{}
	requeue := func() {
		for _, u := range inflight {
			s.queue.requeue(u)
		}
	}
	// drain half-closes the stream and waits for the control plane to end
	// it, which it does once it has read everything sent before.
	drain := func() bool {
		_ = stream.CloseSend()
		select {
		case err := <-recvErr:
			return errors.Is(err, io.EOF)
		case <-s.cfg.Clock.After(s.cfg.DrainTimeout):
		case <-ctx.Done():
		}
		return false
	}

	tick := s.cfg.Clock.After(s.Settings().HeartbeatInterval)
	for {
		if err := s.flush(stream, inflight); err != nil {
			requeue()
			return true, err
		}
		select {
		case <-ctx.Done():
			_ = stream.CloseSend()
			return true, ctx.Err()
		case err := <-recvErr:
			requeue()
			return true, fmt.Errorf("receive: %w", err)
		case <-s.reconnectCh:
			if !drain() {
				requeue()
			}
			return true, errReconnect
		case <-s.closeCh:
			if drain() {
				close(s.drained)
			} else {
				requeue()
			}
			return true, errClosed
		case <-s.settingsCh:
			tick = s.cfg.Clock.After(s.Settings().HeartbeatInterval)
		case <-s.cfg.Status.changed:
			if err := s.sendHeartbeat(stream); err != nil {
				requeue()
				return true, err
			}
		case <-tick:
			if err := s.sendHeartbeat(stream); err != nil {
				requeue()
				return true, err
			}
			tick = s.cfg.Clock.After(s.Settings().HeartbeatInterval)
		case <-s.queue.ready:
		}
	}
}

func (s *Session) sendHeartbeat(stream tetherv1.AgentService_ConnectClient) error {
	hb, gen := s.heartbeat()
	if err := stream.Send(&tetherv1.AgentMessage{Msg: &tetherv1.AgentMessage_Heartbeat{Heartbeat: hb}}); err != nil {
		return fmt.Errorf("send heartbeat: %w", err)
	}
	s.mu.Lock()
	if gen > s.sentGen {
		s.sentGen = gen
		close(s.sentCh)
		s.sentCh = make(chan struct{})
	}
	s.mu.Unlock()
	return nil
}

// flush sends every queued update, noting each in inflight.
func (s *Session) flush(stream tetherv1.AgentService_ConnectClient, inflight map[string]*tetherv1.TaskUpdate) error {
	for {
		it := s.queue.next()
		if it == nil {
			return nil
		}
		if err := stream.Send(&tetherv1.AgentMessage{Msg: &tetherv1.AgentMessage_TaskUpdate{TaskUpdate: it.u}}); err != nil {
			return fmt.Errorf("send task update: %w", err)
		}
		inflight[it.u.TaskId] = it.u
		if then := s.queue.done(it); then != nil {
			then()
		}
	}
}

func (s *Session) heartbeat() (*tetherv1.Heartbeat, uint64) {
	phase, lastErr, modules, gen := s.cfg.Status.snapshot()
	return &tetherv1.Heartbeat{
		Phase:                phase,
		UptimeSeconds:        int64(s.cfg.Uptime() / time.Second),
		AgentVersion:         s.cfg.Version,
		RunningModuleDigests: modules,
		Error:                printable(lastErr, 4096),
		Addresses:            s.cfg.Addresses(),
		BootId:               s.cfg.BootID,
		BootFailed:           s.cfg.Status.failed(),
	}, gen
}

// handle acts on one message from the control plane. It runs on the
// receiving goroutine and must not block.
func (s *Session) handle(msg *tetherv1.ControlMessage) {
	switch m := msg.Msg.(type) {
	case *tetherv1.ControlMessage_Settings:
		st := settingsFrom(m.Settings)
		s.mu.Lock()
		s.settings = st
		s.mu.Unlock()
		select {
		case s.settingsCh <- struct{}{}:
		default:
		}
		if s.cfg.OnSettings != nil {
			s.cfg.OnSettings(st)
		}
	case *tetherv1.ControlMessage_Task:
		s.start(m.Task)
	case *tetherv1.ControlMessage_TrustBundle:
		if s.cfg.OnTrustBundle != nil {
			s.cfg.OnTrustBundle(m.TrustBundle)
		}
	case *tetherv1.ControlMessage_Cancel:
		s.mu.Lock()
		cancel := s.running[m.Cancel.GetTaskId()]
		s.mu.Unlock()
		if cancel != nil {
			cancel(errCancelled)
		}
	default:
		s.cfg.Logf("ignoring a control message of a kind this agent does not know (%T); is the control plane newer than the agent?", m)
	}
}

var errCancelled = errors.New("cancelled by the control plane")

// start runs a task unless it is already running or just finished.
func (s *Session) start(a *tetherv1.TaskAssignment) {
	id := a.GetTaskId()
	s.mu.Lock()
	if _, ok := s.running[id]; ok {
		s.mu.Unlock()
		s.push(&tetherv1.TaskUpdate{TaskId: id, Status: tetherv1.TaskStatus_TASK_STATUS_RUNNING}, nil)
		return
	}
	if final, ok := s.finished[id]; ok {
		s.mu.Unlock()
		s.push(final, nil)
		return
	}
	// Tasks outlive a stream: they are children of the session, not of the
	// connection they arrived on.
	tctx, cancel := context.WithCancelCause(s.base)
	s.running[id] = cancel
	settings := s.settings
	s.mu.Unlock()

	s.push(&tetherv1.TaskUpdate{TaskId: id, Status: tetherv1.TaskStatus_TASK_STATUS_RUNNING}, nil)
	lease := settings.TaskLease
	if exp := a.GetLeaseExpiresAt(); exp != nil {
		if d := exp.AsTime().Sub(s.cfg.Clock.Now()); d > 0 {
			lease = max(d, 3*minInterval)
		}
	}
	s.tasks.Add(1)
	go s.run(tctx, cancel, a, settings, lease)
}

func (s *Session) run(ctx context.Context, cancel context.CancelCauseFunc, a *tetherv1.TaskAssignment, settings Settings, lease time.Duration) {
	defer s.tasks.Done()
	id := a.GetTaskId()
	done := make(chan Outcome, 1)
	go func() { done <- s.cfg.Runner.Run(ctx, a, settings) }()

	var out Outcome
	renew := s.cfg.Clock.After(lease / 3)
wait:
	for {
		select {
		case out = <-done:
			break wait
		case <-renew:
			s.push(&tetherv1.TaskUpdate{TaskId: id, Status: tetherv1.TaskStatus_TASK_STATUS_RUNNING}, nil)
			renew = s.cfg.Clock.After(lease / 3)
		}
	}
	u := &tetherv1.TaskUpdate{TaskId: id, Result: out.Result}
	switch {
	case errors.Is(context.Cause(ctx), errCancelled):
		u.Status = tetherv1.TaskStatus_TASK_STATUS_CANCELLED
		u.ErrorMessage = errCancelled.Error()
	case out.Err != nil:
		u.Status = tetherv1.TaskStatus_TASK_STATUS_FAILED
		u.ErrorMessage = printable(out.Err.Error(), 4096)
	case ctx.Err() != nil:
		u.Status = tetherv1.TaskStatus_TASK_STATUS_FAILED
		u.ErrorMessage = "the agent stopped before the task finished"
	default:
		u.Status = tetherv1.TaskStatus_TASK_STATUS_SUCCEEDED
	}
	cancel(nil)
	s.mu.Lock()
	delete(s.running, id)
	s.finished[id] = u
	s.finishedOrder = append(s.finishedOrder, id)
	if len(s.finishedOrder) > 64 {
		delete(s.finished, s.finishedOrder[0])
		s.finishedOrder = s.finishedOrder[1:]
	}
	s.mu.Unlock()

	var then func()
	if out.Then != nil {
		var once sync.Once
		sent := make(chan struct{})
		then = func() { once.Do(func() { close(sent) }) }
		go func() {
			select {
			case <-sent:
			case <-s.cfg.Clock.After(s.cfg.ThenGrace):
				s.cfg.Logf("task %s: could not report its result within %s; going ahead anyway", id, s.cfg.ThenGrace)
			}
			out.Then()
		}()
	}
	s.push(u, then)
}

func (s *Session) push(u *tetherv1.TaskUpdate, onSent func()) {
	if n := s.queue.push(u, onSent); n > 0 {
		s.cfg.Logf("task update queue full (%d tasks waiting while disconnected): dropped %d older update(s); their leases will lapse and the control plane will re-lease them", s.cfg.QueueSize, n)
	}
}
