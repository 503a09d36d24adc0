package agent

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tetherfleet/tether/agent/identity"
	"github.com/tetherfleet/tether/agent/phases"
)

// The boot's phases, in order: the names an error carries and the
// architecture document lists.
func TestBootPhases(t *testing.T) {
	want := []string{"setup", "announce", "discover", "enroll", "connect", "pull", "compose", "switch", "attach", "serve"}
	if got := (&agent{}).boot().Names(); !slices.Equal(got, want) {
		t.Fatalf("boot phases %v, want %v", got, want)
	}
}

// A failed boot names the phase it stopped in, behind the phase's own
// message.
func TestRunFailureNamesItsPhase(t *testing.T) {
	tests := []struct {
		name  string
		cfg   func(t *testing.T, cp *controlPlane) Config
		phase string
	}{
		{"no enrollment material", func(t *testing.T, _ *controlPlane) Config {
			return Config{Sources: []identity.Source{identity.FwCfgSource{Dir: filepath.Join(t.TempDir(), "none")}}}
		}, "discover"},
		{"a refused token", func(t *testing.T, cp *controlPlane) Config {
			return Config{Sources: []identity.Source{cmdline(t, cp.URL, "tbt_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", cp.ca.Fingerprint)}}
		}, "enroll"},
		{"a corrupt module", func(t *testing.T, cp *controlPlane) Config {
			asg := cp.assign(t, 1, 0)
			cp.Lock()
			cp.Blobs[asg.RootModules[0].Digest][1000] ^= 0xff
			cp.Unlock()
			return Config{Sources: []identity.Source{cmdline(t, cp.URL, cp.AddToken("i-1"), cp.ca.Fingerprint)}}
		}, "pull"},
		{"switch mode without a root switcher", func(t *testing.T, cp *controlPlane) Config {
			cp.assign(t, 1, 0)
			return Config{Sources: []identity.Source{cmdline(t, cp.URL, cp.AddToken("i-1"), cp.ca.Fingerprint)}, RootMode: RootModeSwitch}
		}, "compose"},
		{"a failed switch", func(t *testing.T, cp *controlPlane) Config {
			cp.assign(t, 1, 0)
			return Config{Sources: []identity.Source{cmdline(t, cp.URL, cp.AddToken("i-1"), cp.ca.Fingerprint)}, RootMode: RootModeSwitch, Root: &failingRoot{}}
		}, "switch"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cp := newControlPlane(t)
			cfg := tc.cfg(t, cp)
			cfg.StateDir = t.TempDir()
			err := start(t, cfg).wait(t)
			var pe *phases.Error
			if !errors.As(err, &pe) || pe.Phase != tc.phase {
				t.Fatalf("Run = %v (%#v), want a failure in phase %s", err, err, tc.phase)
			}
		})
	}
}
