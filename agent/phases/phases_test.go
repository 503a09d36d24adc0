package phases

import (
	"context"
	"errors"
	"slices"
	"testing"
)

type state struct{ ran []string }

func record(name string, err error) func(context.Context, *state) error {
	return func(_ context.Context, s *state) error {
		s.ran = append(s.ran, name)
		return err
	}
}

func TestListRun(t *testing.T) {
	boom := errors.New("no route to the control plane")
	tests := []struct {
		name      string
		results   map[string]error
		wantRan   []string
		wantPhase string // "" for a nil error
	}{
		{"every phase in order", nil, []string{"discover", "enroll", "pull", "serve"}, ""},
		{"a failure stops the boot and names its phase", map[string]error{"enroll": boom}, []string{"discover", "enroll"}, "enroll"},
		{"the last phase failing", map[string]error{"serve": boom}, []string{"discover", "enroll", "pull", "serve"}, "serve"},
		{"done ends the boot without fault", map[string]error{"enroll": Done}, []string{"discover", "enroll"}, ""},
		{"a wrapped done too", map[string]error{"discover": errors.Join(Done)}, []string{"discover"}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var l List[state]
			for _, n := range []string{"discover", "enroll", "pull", "serve"} {
				l = l.Append(n, record(n, tc.results[n]))
			}
			s := &state{}
			err := l.Run(context.Background(), s)
			if !slices.Equal(s.ran, tc.wantRan) {
				t.Errorf("ran %v, want %v", s.ran, tc.wantRan)
			}
			if tc.wantPhase == "" {
				if err != nil {
					t.Fatalf("Run = %v, want nil", err)
				}
				return
			}
			var pe *Error
			if !errors.As(err, &pe) || pe.Phase != tc.wantPhase {
				t.Fatalf("Run = %#v, want an *Error naming %s", err, tc.wantPhase)
			}
			if !errors.Is(err, boom) || err.Error() != boom.Error() {
				t.Errorf("Run = %q, want the phase's own error %q, unwrappable", err, boom)
			}
		})
	}
}

func TestListNamesAndAppend(t *testing.T) {
	base := List[state]{}.Append("a", record("a", nil))
	l := base.Append("b", record("b", nil)).Append("c", record("c", nil))
	if got := l.Names(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("Names = %v", got)
	}
	if got := base.Names(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("Append changed the list it was called on: %v", got)
	}
}

// The phases get the context Run was given: a phase that waits on it sees
// the boot's end.
func TestListRunPassesContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	l := List[state]{}.Append("serve", func(ctx context.Context, _ *state) error {
		<-ctx.Done()
		return nil
	})
	if err := l.Run(ctx, &state{}); err != nil {
		t.Fatalf("Run = %v", err)
	}
}
