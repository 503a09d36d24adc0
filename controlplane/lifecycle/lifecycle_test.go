package lifecycle

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

// x marks a refused pair in the tables below.
const x State = ""

// unknownEvent is the ninth column: an event outside the table must be an
// input error from every state, never a refused transition.
const unknownEvent Event = "explode"

// columns fixes the order of the expected tables' columns.
var columns = [8]Event{MarkProvisioning, MarkRunning, Stop, MarkStopped, Start, Reboot, Terminate, MarkErrored}

// wantNext is docs/design.md §2.2 written out by hand, one row per state. It is
// deliberately not derived from the implementation.
var wantNext = map[State][8]State{
	//             mark_prov     mark_running stop      mark_stopped start     reboot     terminate   mark_errored
	Pending:      {Provisioning, x, x, x, x, x, Terminated, Error},
	Provisioning: {x, Running, x, x, x, x, Terminated, Error},
	Starting:     {x, Running, x, x, x, x, Terminated, Error},
	Running:      {x, x, Stopping, x, x, Rebooting, Terminated, Error},
	Stopping:     {x, x, x, Stopped, x, x, Terminated, Error},
	Stopped:      {x, x, x, x, Starting, x, Terminated, Error},
	Rebooting:    {x, Running, x, x, x, x, Terminated, Error},
	Terminated:   {x, x, x, x, x, x, x, x},
	Error:        {x, x, x, x, x, x, Terminated, x},
}

// wantAllowed is the "allowed from" list each refusal must name.
var wantAllowed = map[Event][]State{
	MarkProvisioning: {Pending},
	MarkRunning:      {Provisioning, Starting, Rebooting},
	Stop:             {Running},
	MarkStopped:      {Stopping},
	Start:            {Stopped},
	Reboot:           {Running},
	Terminate:        {Pending, Provisioning, Starting, Running, Stopping, Stopped, Rebooting, Error},
	MarkErrored:      {Pending, Provisioning, Starting, Running, Stopping, Stopped, Rebooting},
}

// wantSatisfied: 1 where a request is already met (a no-op success).
var wantSatisfied = map[State][8]int{
	//             mark_prov mark_running stop mark_stopped start reboot terminate mark_errored
	Pending:      {0, 0, 0, 0, 0, 0, 0, 0},
	Provisioning: {1, 0, 0, 0, 0, 0, 0, 0},
	Starting:     {0, 0, 0, 0, 1, 0, 0, 0},
	Running:      {0, 1, 0, 0, 1, 0, 0, 0},
	Stopping:     {0, 0, 1, 0, 0, 0, 0, 0},
	Stopped:      {0, 0, 1, 1, 0, 0, 0, 0},
	Rebooting:    {0, 0, 0, 0, 0, 0, 0, 0},
	Terminated:   {0, 0, 0, 0, 0, 0, 1, 0},
	Error:        {0, 0, 0, 0, 0, 0, 0, 1},
}

func TestTablesCoverEveryState(t *testing.T) {
	if len(wantNext) != 9 || len(wantSatisfied) != 9 {
		t.Fatalf("expected tables must have 9 rows, have %d and %d", len(wantNext), len(wantSatisfied))
	}
	if got := States(); len(got) != 9 {
		t.Fatalf("States() = %v, want 9 states", got)
	}
	for _, s := range States() {
		if _, ok := wantNext[s]; !ok {
			t.Errorf("state %q missing from the expected table", s)
		}
	}
	if !slices.Equal(Events(), columns[:]) {
		t.Errorf("Events() = %v, want %v", Events(), columns)
	}
}

// TestNextExhaustive checks all 9 states x (8 events + 1 unknown) = 81 pairs.
func TestNextExhaustive(t *testing.T) {
	n := 0
	for _, from := range States() {
		row := wantNext[from]
		for i, ev := range append(columns[:], unknownEvent) {
			n++
			t.Run(fmt.Sprintf("%s/%s", from, ev), func(t *testing.T) {
				got, err := Next(from, ev)
				if ev == unknownEvent {
					if !errors.Is(err, ErrUnknownEvent) {
						t.Fatalf("Next(%s, %s) err = %v, want ErrUnknownEvent", from, ev, err)
					}
					var te *TransitionError
					if errors.As(err, &te) {
						t.Fatalf("unknown event reported as a refused transition: %v", err)
					}
					return
				}
				want := row[i]
				if want == x {
					var te *TransitionError
					if !errors.As(err, &te) {
						t.Fatalf("Next(%s, %s) = %q, %v; want *TransitionError", from, ev, got, err)
					}
					if te.Current != from || te.Event != ev || !slices.Equal(te.AllowedFrom, wantAllowed[ev]) {
						t.Fatalf("TransitionError = %+v, want current %s event %s allowed %v", te, from, ev, wantAllowed[ev])
					}
					if got != "" {
						t.Fatalf("refused pair returned state %q", got)
					}
					return
				}
				if err != nil || got != want {
					t.Fatalf("Next(%s, %s) = %q, %v; want %q", from, ev, got, err, want)
				}
			})
		}
	}
	if n != 81 {
		t.Fatalf("checked %d pairs, want 81", n)
	}
}

func TestSatisfiedExhaustive(t *testing.T) {
	for _, s := range States() {
		for i, ev := range columns {
			want := wantSatisfied[s][i] == 1
			if got := Satisfied(s, ev); got != want {
				t.Errorf("Satisfied(%s, %s) = %v, want %v", s, ev, got, want)
			}
		}
		if Satisfied(s, unknownEvent) {
			t.Errorf("Satisfied(%s, unknown) = true", s)
		}
	}
}

// A satisfied request must never also be an allowed transition: callers
// check Satisfied first, and an overlap would turn a real move into a no-op.
func TestSatisfiedNeverShadowsATransition(t *testing.T) {
	for _, s := range States() {
		for _, ev := range Events() {
			if _, err := Next(s, ev); err == nil && Satisfied(s, ev) {
				t.Errorf("(%s, %s) is both an allowed transition and satisfied", s, ev)
			}
		}
	}
}

func TestAllowedFrom(t *testing.T) {
	for ev, want := range wantAllowed {
		if got := AllowedFrom(ev); !slices.Equal(got, want) {
			t.Errorf("AllowedFrom(%s) = %v, want %v", ev, got, want)
		}
	}
	if got := AllowedFrom(unknownEvent); got != nil {
		t.Errorf("AllowedFrom(unknown) = %v, want nil", got)
	}
	// The returned slice is a copy: changing it must not change the table.
	AllowedFrom(Stop)[0] = Error
	if _, err := Next(Running, Stop); err != nil {
		t.Fatalf("table was mutated through AllowedFrom: %v", err)
	}
}

func TestTransitionErrorMessage(t *testing.T) {
	tests := []struct {
		from State
		ev   Event
		want string
	}{
		{Stopped, Stop, `cannot stop instance in state "stopped": stop is allowed from running`},
		{Running, MarkProvisioning, `cannot mark_provisioning instance in state "running": mark_provisioning is allowed from pending`},
		{Stopped, MarkRunning, `cannot mark_running instance in state "stopped": mark_running is allowed from provisioning, starting, rebooting`},
		{Terminated, Terminate, `cannot terminate instance in state "terminated": terminate is allowed from pending, provisioning, starting, running, stopping, stopped, rebooting, error`},
	}
	for _, tt := range tests {
		_, err := Next(tt.from, tt.ev)
		if err == nil || err.Error() != tt.want {
			t.Errorf("Next(%s, %s) error = %v, want %q", tt.from, tt.ev, err, tt.want)
		}
	}
}

func TestNextUnknownState(t *testing.T) {
	for _, ev := range Events() {
		if _, err := Next("draining", ev); !errors.Is(err, ErrUnknownState) {
			t.Errorf("Next(draining, %s) err = %v, want ErrUnknownState", ev, err)
		}
	}
}

func TestParse(t *testing.T) {
	for _, s := range States() {
		got, err := ParseState(string(s))
		if err != nil || got != s {
			t.Errorf("ParseState(%q) = %q, %v", s, got, err)
		}
	}
	for _, bad := range []string{"", "Running", "draining", "failed", "terminating", "bootstrapping", " running"} {
		if _, err := ParseState(bad); !errors.Is(err, ErrUnknownState) {
			t.Errorf("ParseState(%q) err = %v, want ErrUnknownState", bad, err)
		}
	}
	for _, ev := range Events() {
		got, err := ParseEvent(string(ev))
		if err != nil || got != ev {
			t.Errorf("ParseEvent(%q) = %q, %v", ev, got, err)
		}
	}
	if _, err := ParseEvent("drain"); !errors.Is(err, ErrUnknownEvent) {
		t.Errorf("ParseEvent(drain) err = %v", err)
	}
}

func TestTerminal(t *testing.T) {
	for _, s := range States() {
		if got, want := s.Terminal(), s == Terminated; got != want {
			t.Errorf("%s.Terminal() = %v, want %v", s, got, want)
		}
	}
}

func TestStatesReturnsCopy(t *testing.T) {
	States()[0] = Error
	Events()[0] = Reboot
	if States()[0] != Pending || Events()[0] != MarkProvisioning {
		t.Fatal("States/Events expose the package's slices")
	}
}
