package sqlstore

import (
	"errors"
	"testing"

	"github.com/tetherfleet/tether/controlplane/lifecycle"
)

func TestStateNamesRoundTrip(t *testing.T) {
	for _, st := range lifecycle.States() {
		name, err := storedState(st)
		if err != nil {
			t.Fatalf("store %q: %v", st, err)
		}
		back, err := parseStoredState(name)
		if err != nil || back != st {
			t.Fatalf("read %q = %q, %v; want %q", name, back, err, st)
		}
	}
	for _, st := range append(lifecycle.PoolStates(), lifecycle.NoPool) {
		name, err := storedPoolState(st)
		if err != nil {
			t.Fatalf("store %q: %v", st, err)
		}
		back, err := parseStoredPoolState(name)
		if err != nil || back != st {
			t.Fatalf("read %q = %q, %v; want %q", name, back, err, st)
		}
	}
}

func TestUnknownStateNamesRefused(t *testing.T) {
	tests := []struct {
		name string
		err  error
		fn   func() error
	}{
		{"read instance state", lifecycle.ErrUnknownState, func() error { _, err := parseStoredState("draining"); return err }},
		{"read empty instance state", lifecycle.ErrUnknownState, func() error { _, err := parseStoredState(""); return err }},
		{"write instance state", lifecycle.ErrUnknownState, func() error { _, err := storedState("exploded"); return err }},
		{"read pool state", lifecycle.ErrUnknownPoolState, func() error { _, err := parseStoredPoolState("running"); return err }},
		{"write pool state", lifecycle.ErrUnknownPoolState, func() error { _, err := storedPoolState("Ready"); return err }},
		{"filter", lifecycle.ErrUnknownState, func() error {
			_, err := storedStates([]lifecycle.State{lifecycle.Running, "bogus"}, storedState)
			return err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.fn(); !errors.Is(err, tc.err) {
				t.Fatalf("got %v, want %v", err, tc.err)
			}
		})
	}
}
