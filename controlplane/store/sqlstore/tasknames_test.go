package sqlstore

import (
	"errors"
	"testing"

	"github.com/tetherfleet/tether/controlplane/store"
)

func TestTaskNamesRoundTrip(t *testing.T) {
	for _, st := range store.TaskStatuses() {
		name, err := storedTaskStatus(st)
		if err != nil {
			t.Fatalf("store %q: %v", st, err)
		}
		if back, err := parseStoredTaskStatus(name); err != nil || back != st {
			t.Fatalf("read %q = %q, %v; want %q", name, back, err, st)
		}
	}
	for _, tg := range []store.TaskTarget{store.TaskTargetAgent, store.TaskTargetWorker} {
		name, err := storedTaskTarget(tg)
		if err != nil {
			t.Fatalf("store %q: %v", tg, err)
		}
		if back, err := parseStoredTaskTarget(name); err != nil || back != tg {
			t.Fatalf("read %q = %q, %v; want %q", name, back, err, tg)
		}
	}
}

// TestUnknownTaskNamesRefused: task statuses and targets are closed sets,
// refused on the way in and on the way out as the states are.
func TestUnknownTaskNamesRefused(t *testing.T) {
	tests := []struct {
		name string
		fn   func() error
	}{
		{"read status", func() error { _, err := parseStoredTaskStatus("done"); return err }},
		{"read empty status", func() error { _, err := parseStoredTaskStatus(""); return err }},
		{"write status", func() error { _, err := storedTaskStatus("Pending"); return err }},
		{"read target", func() error { _, err := parseStoredTaskTarget("node"); return err }},
		{"write empty target", func() error { _, err := storedTaskTarget(""); return err }},
		{"write task", func() error {
			_, err := taskArgs(&store.Task{ID: "t1", Target: store.TaskTargetAgent, Status: "queued"})
			return err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.fn(); !errors.Is(err, store.ErrUnknownValue) {
				t.Fatalf("got %v, want %v", err, store.ErrUnknownValue)
			}
		})
	}
}
