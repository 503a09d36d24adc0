// Package lifecycle is the instance state machine: a pure table from
// (state, event) to the next state. It knows nothing of storage, providers or
// gRPC, so every caller (API, workers, reconcilers) shares one answer to
// "may this instance do that now?". The API layer maps *TransitionError to
// FailedPrecondition.
package lifecycle

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// State is an instance's lifecycle state (docs/design.md §2.1).
type State string

// The nine states. There is deliberately no draining, failed, terminating or
// bootstrapping state: draining is a pool state, and the boot window lives
// inside provisioning.
const (
	Pending      State = "pending"
	Provisioning State = "provisioning"
	Starting     State = "starting"
	Running      State = "running"
	Stopping     State = "stopping"
	Stopped      State = "stopped"
	Rebooting    State = "rebooting"
	Terminated   State = "terminated"
	Error        State = "error"
)

// Event is something that moves an instance between states.
type Event string

// The eight events.
const (
	MarkProvisioning Event = "mark_provisioning"
	MarkRunning      Event = "mark_running"
	Stop             Event = "stop"
	MarkStopped      Event = "mark_stopped"
	Start            Event = "start"
	Reboot           Event = "reboot"
	Terminate        Event = "terminate"
	MarkErrored      Event = "mark_errored"
)

// ErrUnknownState and ErrUnknownEvent mark values outside the table. They are
// input errors (InvalidArgument), not refused transitions.
var (
	ErrUnknownState = errors.New("unknown instance state")
	ErrUnknownEvent = errors.New("unknown instance event")
)

var allStates = []State{Pending, Provisioning, Starting, Running, Stopping, Stopped, Rebooting, Terminated, Error}

var allEvents = []Event{MarkProvisioning, MarkRunning, Stop, MarkStopped, Start, Reboot, Terminate, MarkErrored}

// rule is one row of the table in docs/design.md §2.2.
type rule struct {
	from []State
	to   State
}

// nonTerminal lists every state an instance can leave, in table order.
var nonTerminal = []State{Pending, Provisioning, Starting, Running, Stopping, Stopped, Rebooting, Error}

// table is the whole state machine. It is written out rather than computed so
// a reader can check it against docs/design.md §2.2 line by line.
var table = map[Event]rule{
	MarkProvisioning: {from: []State{Pending}, to: Provisioning},
	MarkRunning:      {from: []State{Provisioning, Starting, Rebooting}, to: Running},
	Stop:             {from: []State{Running}, to: Stopping},
	MarkStopped:      {from: []State{Stopping}, to: Stopped},
	Start:            {from: []State{Stopped}, to: Starting},
	Reboot:           {from: []State{Running}, to: Rebooting},
	// Terminate must work from error and from every in-flight state, so a
	// stuck instance can always be cleaned up without a detour.
	Terminate: {from: nonTerminal, to: Terminated},
	// mark_errored is refused from error itself: error→error would rewrite
	// the first failure's reason with a later, usually less useful one.
	// Callers that see a *TransitionError for it can treat the instance as
	// already errored (Satisfied reports true).
	MarkErrored: {from: []State{Pending, Provisioning, Starting, Running, Stopping, Stopped, Rebooting}, to: Error},
}

// States returns the nine states in lifecycle order.
func States() []State { return slices.Clone(allStates) }

// Events returns the eight events.
func Events() []Event { return slices.Clone(allEvents) }

// ParseState converts stored or user text into a State.
func ParseState(s string) (State, error) {
	st := State(s)
	if !slices.Contains(allStates, st) {
		return "", fmt.Errorf("%w %q", ErrUnknownState, s)
	}
	return st, nil
}

// ParseEvent converts text into an Event.
func ParseEvent(s string) (Event, error) {
	ev := Event(s)
	if _, ok := table[ev]; !ok {
		return "", fmt.Errorf("%w %q", ErrUnknownEvent, s)
	}
	return ev, nil
}

// Terminal reports whether nothing can leave s. Only terminated is terminal:
// error still allows terminate.
func (s State) Terminal() bool { return s == Terminated }

// Valid reports whether s is one of the nine states.
func (s State) Valid() bool { return slices.Contains(allStates, s) }

// AllowedFrom returns the states from which ev is accepted, or nil for an
// unknown event.
func AllowedFrom(ev Event) []State {
	r, ok := table[ev]
	if !ok {
		return nil
	}
	return slices.Clone(r.from)
}

// TransitionError is a refused (state, event) pair. Its message names the
// current state and the states the event is allowed from, so an operator can
// see what to do without reading the design.
type TransitionError struct {
	Current     State
	Event       Event
	AllowedFrom []State
}

func (e *TransitionError) Error() string {
	from := make([]string, len(e.AllowedFrom))
	for i, s := range e.AllowedFrom {
		from[i] = string(s)
	}
	return fmt.Sprintf("cannot %s instance in state %q: %s is allowed from %s",
		e.Event, e.Current, e.Event, strings.Join(from, ", "))
}

// Next returns the state ev leads to from `from`. A refused pair is a
// *TransitionError; an unknown state or event wraps ErrUnknownState or
// ErrUnknownEvent.
func Next(from State, ev Event) (State, error) {
	r, ok := table[ev]
	if !ok {
		return "", fmt.Errorf("lifecycle: %w %q", ErrUnknownEvent, ev)
	}
	if !from.Valid() {
		return "", fmt.Errorf("lifecycle: %w %q", ErrUnknownState, from)
	}
	if !slices.Contains(r.from, from) {
		return "", &TransitionError{Current: from, Event: ev, AllowedFrom: slices.Clone(r.from)}
	}
	return r.to, nil
}

// Satisfied reports whether an instance in state s already is where ev leads,
// or is on its way there, so the caller can answer the request as a no-op
// success (docs/design.md §0.3) instead of refusing it:
//   - stop: stopping or stopped;
//   - start: starting or running;
//   - terminate: terminated;
//   - reboot: never, because a reboot asked for is a new boot wanted;
//   - the mark_* events: when s already is their target (a repeated ready
//     heartbeat, a re-leased provision task, a second failure report).
func Satisfied(s State, ev Event) bool {
	switch ev {
	case Reboot:
		return false
	case Stop:
		return s == Stopping || s == Stopped
	case Start:
		return s == Starting || s == Running
	}
	r, ok := table[ev]
	return ok && s == r.to
}
