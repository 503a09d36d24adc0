package bench

import (
	"context"
	"crypto/tls"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

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
	// EnrollRate bounds enrollments per second (0: unbounded).
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
	// Node is what the agents' instances are provisioned from.
	Node string
	// Workers enroll in parallel (default 16).
	Workers int
}

// Fleet is a running simulated fleet.
type Fleet struct {
	o         FleetOptions
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	connected atomic.Int64
	enrolled  atomic.Int64
	sent      atomic.Int64
	errs      atomic.Int64
	reconnect atomic.Int64
	mu        sync.Mutex
	firstErrs []string
}

// FleetStats is a shard's counts.
type FleetStats struct {
	Agents     int      `json:"agents"`
	Enrolled   int64    `json:"enrolled"`
	Connected  int64    `json:"connected"`
	Sent       int64    `json:"heartbeats_sent"`
	Errors     int64    `json:"errors"`
	Reconnects int64    `json:"reconnects"`
	FirstErrs  []string `json:"first_errors,omitempty"`
}

// Add sums another shard's counts into s.
func (s *FleetStats) Add(o FleetStats) {
	s.Agents += o.Agents
	s.Enrolled += o.Enrolled
	s.Connected += o.Connected
	s.Sent += o.Sent
	s.Errors += o.Errors
	s.Reconnects += o.Reconnects
	for _, e := range o.FirstErrs {
		if len(s.FirstErrs) < 5 {
			s.FirstErrs = append(s.FirstErrs, e)
		}
	}
}

// StartFleet enrolls and connects the agents at the bounded rate and
// returns once each has been tried; they run until Stop. A failed
// enrollment is counted, not fatal: a fleet run reports its errors.
func StartFleet(ctx context.Context, o FleetOptions) *Fleet {
	if o.Workers <= 0 {
		o.Workers = 16
	}
	if o.Jitter <= 0 {
		o.Jitter = 0.1
	}
	fctx, cancel := context.WithCancel(ctx)
	f := &Fleet{o: o, ctx: fctx, cancel: cancel}
	jobs := make(chan int)
	var enrolling sync.WaitGroup
	for w := 0; w < o.Workers; w++ {
		enrolling.Add(1)
		go func() {
			defer enrolling.Done()
			for i := range jobs {
				a, err := enrollOne(fctx, o.Admin, o.Enroll, o.Node)
				if err != nil {
					f.fail(fmt.Errorf("enroll agent %d: %w", o.Offset+i, err))
					continue
				}
				f.enrolled.Add(1)
				var src net.IP
				if len(o.Sources) > 0 {
					src = o.Sources[(o.Offset+i)%len(o.Sources)]
				}
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

func (f *Fleet) fail(err error) {
	if f.ctx.Err() != nil {
		return // stopping: a cut stream is expected
	}
	f.errs.Add(1)
	f.mu.Lock()
	if len(f.firstErrs) < 5 {
		f.firstErrs = append(f.firstErrs, err.Error())
	}
	f.mu.Unlock()
}

// run keeps one agent connected, reconnecting with jitter as a real
// agent does, until the fleet stops.
func (f *Fleet) run(a *SimAgent, src net.IP) {
	defer f.wg.Done()
	for {
		err := f.session(a, src)
		if f.ctx.Err() != nil {
			return
		}
		f.fail(fmt.Errorf("agent %s: %w", a.InstanceID, err))
		f.reconnect.Add(1)
		select {
		case <-f.ctx.Done():
			return
		case <-time.After(time.Second + rand.N(4*time.Second)):
		}
	}
}

func (f *Fleet) session(a *SimAgent, src net.IP) error {
	conn, err := f.o.Dial(src, &a.Cert)
	if err != nil {
		return err
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	s, err := v1.NewAgentServiceClient(conn).Connect(sctx)
	if err != nil {
		return err
	}
	a.sendMu.Lock()
	a.conn, a.stream = conn, s
	a.sendMu.Unlock()
	if err := a.Heartbeat(v1.AgentPhase_AGENT_PHASE_READY); err != nil {
		return err
	}
	f.sent.Add(1)
	f.connected.Add(1)
	defer f.connected.Add(-1)
	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := s.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			if t := m.GetTask(); t != nil {
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
			return nil
		case err := <-recvErr:
			return fmt.Errorf("stream: %w", err)
		case <-next:
			if err := a.Heartbeat(v1.AgentPhase_AGENT_PHASE_READY); err != nil {
				return fmt.Errorf("heartbeat: %w", err)
			}
			f.sent.Add(1)
			j := 1 + f.o.Jitter*(2*rand.Float64()-1)
			timer.Reset(time.Duration(float64(f.o.Heartbeat) * j))
		}
	}
}

// Connected is the agents whose stream is open now.
func (f *Fleet) Connected() int { return int(f.connected.Load()) }

// Stats snapshots the counts.
func (f *Fleet) Stats() FleetStats {
	f.mu.Lock()
	errs := append([]string(nil), f.firstErrs...)
	f.mu.Unlock()
	return FleetStats{Agents: f.o.Agents, Enrolled: f.enrolled.Load(), Connected: f.connected.Load(), Sent: f.sent.Load(),
		Errors: f.errs.Load(), Reconnects: f.reconnect.Load(), FirstErrs: errs}
}

// Stop ends every stream and waits for the agents to go.
func (f *Fleet) Stop() {
	f.cancel()
	f.wg.Wait()
}
