// Package fake is an in-memory providers.Provider for tests. It keeps
// machines in a map, records every call so a test can assert what the control
// plane asked for, and lets a test inject failures, delays and drift (a
// machine that vanished, or one that came back after it was terminated).
package fake

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/providers"
)

// Name is the provider's registered name.
const Name = "fake"

// Op names a provider method.
type Op string

// The seven provider operations.
const (
	OpProvision Op = "provision"
	OpStart     Op = "start"
	OpStop      Op = "stop"
	OpReboot    Op = "reboot"
	OpTerminate Op = "terminate"
	OpStatus    Op = "status"
	OpList      Op = "list"
)

// Ops returns every operation, for table-driven tests.
func Ops() []Op {
	return []Op{OpProvision, OpStart, OpStop, OpReboot, OpTerminate, OpStatus, OpList}
}

// Call is one recorded provider call. Spec and Boot are copies (with the
// token: this is a test double, and tests assert the token was handed over).
type Call struct {
	Op   Op
	ID   string // machine id; for provision the id the machine gets; "" for list
	Spec *providers.Spec
	Boot *providers.Boot
	// Err is what the call returned, so a test can tell attempts that failed
	// from ones that took effect.
	Err error
	At  time.Time
}

// Fault describes an injected failure.
type Fault struct {
	Kind providers.Kind
	// Times is how many calls fail; 0 means every call until cleared.
	Times int
	// AfterEffect makes the call do its work and then report failure, the
	// "the machine was destroyed but the answer was lost" case.
	AfterEffect bool
	// Message is the error text; a default names the injection.
	Message string
}

type fault struct {
	Fault
	remaining int // only meaningful when Times > 0
}

type machine struct {
	m          providers.Machine
	enrollment providers.Enrollment
	boots      int
}

// Provider is the fake. The zero value is not usable; call New.
type Provider struct {
	clock clock.Clock

	mu       sync.Mutex
	machines map[string]*machine
	// graveyard remembers terminated or vanished machines so Resurrect can
	// bring one back, the way a leaked VM reappears in a provider's list.
	graveyard map[string]*machine
	calls     []Call
	faults    map[Op]*fault
	delays    map[Op]time.Duration
	gates     map[Op]*gate
	// stateFile, when set, holds the machine list: every call reloads it
	// under its lock and rewrites it if it changed a machine (see Open).
	stateFile string
	onExit    func(providers.Exit)
}

// Option configures New.
type Option func(*Provider)

// WithClock sets the clock used to stamp calls.
func WithClock(c clock.Clock) Option { return func(p *Provider) { p.clock = c } }

// New returns an empty fake provider.
func New(opts ...Option) *Provider {
	p := &Provider{
		clock:     clock.Real{},
		machines:  map[string]*machine{},
		graveyard: map[string]*machine{},
		faults:    map[Op]*fault{},
		delays:    map[Op]time.Duration{},
		gates:     map[Op]*gate{},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

var _ providers.Provider = (*Provider)(nil)

// MachineID is the id the fake gives the machine of an instance. It is
// derived from the instance id so Provision is idempotent without a lookup
// table.
func MachineID(instanceID string) string { return "fake-" + instanceID }

// Name implements providers.Provider.
func (p *Provider) Name() string { return Name }

// Provision implements providers.Provider.
func (p *Provider) Provision(ctx context.Context, spec providers.Spec) (providers.Machine, error) {
	id := MachineID(spec.InstanceID)
	sp := spec
	var out providers.Machine
	err := p.do(ctx, Call{Op: OpProvision, ID: id, Spec: &sp}, func() error {
		if spec.InstanceID == "" {
			return providers.Errorf(providers.KindPermanent, Name, string(OpProvision), "instance id is required")
		}
		if m, ok := p.machines[id]; ok {
			out = clone(m.m)
			return nil
		}
		m := &machine{
			m:          providers.Machine{ID: id, InstanceID: spec.InstanceID, State: providers.StateRunning},
			enrollment: spec.Boot.Enrollment,
			boots:      1,
		}
		p.machines[id] = m
		delete(p.graveyard, id)
		out = clone(m.m)
		return nil
	})
	return out, err
}

// Start implements providers.Provider. A running machine is left alone and
// keeps its enrollment: no new boot happened, so no new token was handed
// over.
func (p *Provider) Start(ctx context.Context, id string, boot providers.Boot) (providers.Machine, error) {
	b := boot
	return p.power(ctx, Call{Op: OpStart, ID: id, Boot: &b}, func(m *machine) {
		if m.m.State == providers.StateRunning {
			return
		}
		m.m.State = providers.StateRunning
		m.enrollment = boot.Enrollment
		m.boots++
	})
}

// Stop implements providers.Provider.
func (p *Provider) Stop(ctx context.Context, id string) (providers.Machine, error) {
	return p.power(ctx, Call{Op: OpStop, ID: id}, func(m *machine) {
		m.m.State = providers.StateStopped
	})
}

// Reboot implements providers.Provider. Like the qemu provider, it boots the
// machine with the new enrollment whatever state it was in.
func (p *Provider) Reboot(ctx context.Context, id string, boot providers.Boot) (providers.Machine, error) {
	b := boot
	return p.power(ctx, Call{Op: OpReboot, ID: id, Boot: &b}, func(m *machine) {
		m.m.State = providers.StateRunning
		m.enrollment = boot.Enrollment
		m.boots++
	})
}

func (p *Provider) power(ctx context.Context, c Call, apply func(*machine)) (providers.Machine, error) {
	var out providers.Machine
	err := p.do(ctx, c, func() error {
		m, ok := p.machines[c.ID]
		if !ok {
			return providers.Errorf(providers.KindNotFound, Name, string(c.Op), "machine %q not found", c.ID)
		}
		apply(m)
		out = clone(m.m)
		return nil
	})
	return out, err
}

// Terminate implements providers.Provider. A machine that is already gone is
// success.
func (p *Provider) Terminate(ctx context.Context, id string) error {
	return p.do(ctx, Call{Op: OpTerminate, ID: id}, func() error {
		if m, ok := p.machines[id]; ok {
			p.graveyard[id] = m
			delete(p.machines, id)
		}
		return nil
	})
}

// Status implements providers.Provider. An unknown id is StateGone with a nil
// error.
func (p *Provider) Status(ctx context.Context, id string) (providers.Machine, error) {
	out := providers.Machine{ID: id, State: providers.StateGone}
	err := p.do(ctx, Call{Op: OpStatus, ID: id}, func() error {
		if m, ok := p.machines[id]; ok {
			out = clone(m.m)
		}
		return nil
	})
	if err != nil {
		return providers.Machine{}, err
	}
	return out, nil
}

// List implements providers.Provider, sorted by id.
func (p *Provider) List(ctx context.Context) ([]providers.Machine, error) {
	var out []providers.Machine
	err := p.do(ctx, Call{Op: OpList}, func() error {
		out = p.snapshot()
		return nil
	})
	return out, err
}

// do runs one call: wait for any gate and delay (outside the lock, honouring
// ctx), then apply injected faults around the effect, and record the call.
func (p *Provider) do(ctx context.Context, c Call, effect func() error) error {
	if err := p.wait(ctx, c.Op); err != nil {
		p.record(c, err)
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var err error
	if ferr := p.inFile(mutates(c.Op), func() { err = p.apply(c.Op, effect) }); ferr != nil {
		// The state file could not be read (no effect) or written (an
		// effect that is not durable): report it the way a provider
		// reports a lost answer, so the caller reconciles.
		err = providers.Errorf(providers.KindTransient, Name, string(c.Op), "%v", ferr)
	}
	c.Err = err
	c.At = p.clock.Now()
	p.calls = append(p.calls, c)
	return err
}

// apply runs effect with any injected fault of op around it. Callers hold
// p.mu.
func (p *Provider) apply(op Op, effect func() error) error {
	f := p.takeFault(op)
	switch {
	case f == nil:
		return effect()
	case f.AfterEffect:
		if err := effect(); err != nil {
			return err
		}
		return f.err(op)
	default:
		return f.err(op)
	}
}

func (p *Provider) record(c Call, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c.Err = err
	c.At = p.clock.Now()
	p.calls = append(p.calls, c)
}

func (p *Provider) wait(ctx context.Context, op Op) error {
	p.mu.Lock()
	d := p.delays[op]
	g := p.gates[op]
	p.mu.Unlock()
	if g != nil {
		g.enter()
		select {
		case <-g.open:
		case <-ctx.Done():
			return providers.Errorf(providers.KindTransient, Name, string(op), "waiting for gate: %w", ctx.Err())
		}
	}
	if d > 0 {
		// Wall-clock latency, not the injected clock: a delay models a
		// slow provider in tests that race real goroutines against it.
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return providers.Errorf(providers.KindTransient, Name, string(op), "delayed call: %w", ctx.Err())
		}
	}
	if err := ctx.Err(); err != nil {
		return providers.Errorf(providers.KindTransient, Name, string(op), "%w", err)
	}
	return nil
}

// takeFault returns the fault to apply to this call, consuming one use of a
// counted fault. Callers hold p.mu.
func (p *Provider) takeFault(op Op) *fault {
	f, ok := p.faults[op]
	if !ok {
		return nil
	}
	if f.Times > 0 {
		f.remaining--
		if f.remaining <= 0 {
			delete(p.faults, op)
		}
	}
	return f
}

func (f *fault) err(op Op) error {
	msg := f.Message
	if msg == "" {
		msg = "injected failure"
	}
	return providers.Errorf(f.Kind, Name, string(op), "%s", msg)
}

// Inject makes calls of op fail as f describes, replacing any earlier fault
// for op.
func (p *Provider) Inject(op Op, f Fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults[op] = &fault{Fault: f, remaining: f.Times}
}

// FailNext makes the next n calls of op fail with kind, before any effect.
func (p *Provider) FailNext(op Op, n int, kind providers.Kind) {
	if n <= 0 {
		return
	}
	p.Inject(op, Fault{Kind: kind, Times: n})
}

// FailAlways makes every call of op fail with kind until ClearFailures.
func (p *Provider) FailAlways(op Op, kind providers.Kind) {
	p.Inject(op, Fault{Kind: kind})
}

// ClearFailures removes the injected faults of the given ops, or of every op
// when none is given.
func (p *Provider) ClearFailures(ops ...Op) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(ops) == 0 {
		clear(p.faults)
		return
	}
	for _, op := range ops {
		delete(p.faults, op)
	}
}

// SetDelay makes calls of op take d before they act (0 removes it). A call
// whose ctx ends first fails with a transient error and has no effect.
func (p *Provider) SetDelay(op Op, d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if d <= 0 {
		delete(p.delays, op)
		return
	}
	p.delays[op] = d
}

// gate holds the calls of one op (see Block).
type gate struct {
	open    chan struct{}
	entered chan struct{}
	once    sync.Once
}

func newGate() *gate { return &gate{open: make(chan struct{}), entered: make(chan struct{})} }

func (g *gate) enter() { g.once.Do(func() { close(g.entered) }) }

// Block makes calls of op wait until the returned release function is called
// (or their ctx ends). It lets a test hold a call in flight, for example to
// restart the control plane between a terminate's intent and its effect.
// Release is safe to call more than once.
func (p *Provider) Block(op Op) (release func()) {
	g := newGate()
	p.mu.Lock()
	p.gates[op] = g
	p.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			if p.gates[op] == g {
				delete(p.gates, op)
			}
			p.mu.Unlock()
			close(g.open)
		})
	}
}

// Entered returns a channel closed once a call of op has reached the gate
// Block set up, so a test knows the call is in flight (and everything the
// caller did before it is done) without polling for its traces. It is nil
// when op is not blocked.
func (p *Provider) Entered(op Op) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if g := p.gates[op]; g != nil {
		return g.entered
	}
	return nil
}

// Calls returns a copy of every recorded call, oldest first.
func (p *Provider) Calls() []Call {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.calls)
}

// CallsFor returns the recorded calls of one op.
func (p *Provider) CallsFor(op Op) []Call {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Call
	for _, c := range p.calls {
		if c.Op == op {
			out = append(out, c)
		}
	}
	return out
}

// ResetCalls forgets the recorded calls.
func (p *Provider) ResetCalls() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = nil
}

// Enrollment returns the enrollment of the machine's latest boot: what a
// real machine would have found in fw_cfg.
func (p *Provider) Enrollment(id string) (e providers.Enrollment, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mustInFile(false, func() {
		var m *machine
		if m, ok = p.machines[id]; ok {
			e = m.enrollment
		}
	})
	return e, ok
}

// Boots returns how many times the machine has booted (provision counts as
// the first).
func (p *Provider) Boots(id string) (n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mustInFile(false, func() {
		if m, ok := p.machines[id]; ok {
			n = m.boots
		}
	})
	return n
}

// Machines returns the machines that exist, sorted by id.
func (p *Provider) Machines() (out []providers.Machine) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mustInFile(false, func() { out = p.snapshot() })
	return out
}

func (p *Provider) snapshot() []providers.Machine {
	out := make([]providers.Machine, 0, len(p.machines))
	for _, id := range slices.Sorted(maps.Keys(p.machines)) {
		out = append(out, clone(p.machines[id].m))
	}
	return out
}

// clone copies m so callers cannot reach the fake's state through Addresses.
func clone(m providers.Machine) providers.Machine {
	m.Addresses = slices.Clone(m.Addresses)
	return m
}

// Vanish removes a machine behind the control plane's back, as a cloud
// console delete or a crashed hypervisor would. It reports whether the
// machine existed.
func (p *Provider) Vanish(id string) (ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mustInFile(true, func() {
		var m *machine
		if m, ok = p.machines[id]; ok {
			p.graveyard[id] = m
			delete(p.machines, id)
		}
	})
	return ok
}

// Resurrect brings a terminated or vanished machine back as running: the
// "terminated row whose guest still exists" drift. It reports whether the
// fake remembered the machine. The graveyard is this Provider's own: with
// a state file, only a machine this process saw go can come back.
func (p *Provider) Resurrect(id string) (ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mustInFile(true, func() {
		var m *machine
		if m, ok = p.graveyard[id]; ok {
			delete(p.graveyard, id)
			m.m.State = providers.StateRunning
			p.machines[id] = m
		}
	})
	return ok
}

// Plant adds (or replaces) a machine the control plane never asked for.
func (p *Provider) Plant(m providers.Machine) {
	if m.State == "" {
		m.State = providers.StateRunning
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mustInFile(true, func() {
		delete(p.graveyard, m.ID)
		p.machines[m.ID] = &machine{m: clone(m), boots: 1}
	})
}

// SetState forces a machine's observed state. StateGone is the same as
// Vanish. It reports whether the machine existed.
func (p *Provider) SetState(id string, state providers.MachineState) bool {
	if state == providers.StateGone {
		return p.Vanish(id)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var ok bool
	p.mustInFile(true, func() {
		var m *machine
		if m, ok = p.machines[id]; ok {
			m.m.State = state
		}
	})
	return ok
}

// Exited implements providers.ExitReporter: a machine that is stopped
// (Crash, SetState) or that this fake once had and lost (Vanish,
// Terminate) has exited. An id it never had is "not known", as for a
// real provider's machine that some other system made. It reads the
// state file like every call, so a machine another process marked
// stopped is seen at once. It is not recorded among the calls: it
// observes, as a provider's own bookkeeping does.
func (p *Provider) Exited(id string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var state providers.MachineState
	if err := p.inFile(false, func() {
		if m, ok := p.machines[id]; ok {
			state = m.m.State
		} else if _, ok := p.graveyard[id]; ok {
			state = providers.StateGone
		}
	}); err != nil {
		return "", false
	}
	switch state {
	case providers.StateStopped:
		return "fake machine " + id + " stopped", true
	case providers.StateGone:
		return "fake machine " + id + " gone", true
	}
	return "", false
}

var _ providers.ExitReporter = (*Provider)(nil)

// WatchExits implements providers.ExitWatcher: Crash reports to f until
// ctx ends.
func (p *Provider) WatchExits(ctx context.Context, f func(providers.Exit)) {
	p.mu.Lock()
	p.onExit = f
	p.mu.Unlock()
	context.AfterFunc(ctx, func() {
		p.mu.Lock()
		p.onExit = nil
		p.mu.Unlock()
	})
}

var _ providers.ExitWatcher = (*Provider)(nil)

// Crash stops a machine behind the control plane's back, as a killed QEMU
// process would: its state becomes stopped with detail, and the exit is
// reported to the watcher (after the state changed, as a reaped child is).
// It reports whether the machine existed.
func (p *Provider) Crash(id, detail string) bool {
	p.mu.Lock()
	var ok bool
	var instanceID string
	p.mustInFile(true, func() {
		var m *machine
		if m, ok = p.machines[id]; ok {
			m.m.State, m.m.Detail = providers.StateStopped, detail
			instanceID = m.m.InstanceID
		}
	})
	notify := p.onExit
	p.mu.Unlock()
	if ok && notify != nil {
		notify(providers.Exit{MachineID: id, InstanceID: instanceID, Detail: detail})
	}
	return ok
}

// String summarises the fake for test failure messages. It reports the
// machine list as last loaded, without touching the state file.
func (p *Provider) String() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return fmt.Sprintf("fake provider: %d machines, %d calls", len(p.machines), len(p.calls))
}
