// Package phases runs a boot as a list of named phases over one state, and
// owns the background loops those phases start, so that one place stops
// them. The agent's boot (discover, enroll, connect, pull, compose, switch,
// serve) is such a list; a new step is one more Append, not another branch
// in one long function.
package phases

import (
	"context"
	"errors"
)

// Done ends the boot early without fault: a phase that did the whole job
// (announce mode, say) returns it, and the phases after it do not run.
var Done = errors.New("the boot ended early")

// Phase is one named step of a boot.
type Phase[S any] struct {
	Name string
	Run  func(ctx context.Context, s *S) error
}

// List is the boot, in order.
type List[S any] []Phase[S]

// Append returns the list with one more phase at its end.
func (l List[S]) Append(name string, run func(ctx context.Context, s *S) error) List[S] {
	return append(l, Phase[S]{Name: name, Run: run})
}

// Names lists the phases in the order they run.
func (l List[S]) Names() []string {
	names := make([]string, len(l))
	for i, p := range l {
		names[i] = p.Name
	}
	return names
}

// Error is a phase's failure. Its message is the phase's own, so what the
// operator reads does not change with the list; Phase says where the boot
// stopped.
type Error struct {
	Phase string
	Err   error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Run runs the phases in order on s. It stops at the first that fails,
// returning an *Error naming it, or at one that returns Done, returning
// nil. Each phase sees ctx end on its own terms (the last one's job is
// to say goodbye when it does), so Run does not cut the list short.
func (l List[S]) Run(ctx context.Context, s *S) error {
	for _, p := range l {
		err := p.Run(ctx, s)
		if errors.Is(err, Done) {
			return nil
		}
		if err != nil {
			return &Error{Phase: p.Name, Err: err}
		}
	}
	return nil
}
