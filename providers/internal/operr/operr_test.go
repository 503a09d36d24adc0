package operr

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/providers"
)

func TestErrors(t *testing.T) {
	p := For("qemu")
	already := p.Permanent(Start, "i-1", errors.New("bad kernel"))
	tests := []struct {
		name string
		err  error
		kind providers.Kind
		say  []string
	}{
		{"permanent", p.Permanent(Start, "i-1", errors.New("bad kernel")), providers.KindPermanent, []string{"qemu", "start", "i-1", "bad kernel"}},
		{"transient", p.Transient(Stop, "i-2", errors.New("qmp busy")), providers.KindTransient, []string{"stop", "i-2", "qmp busy"}},
		{"not found", p.NotFound(Status, "i-3", "no such machine"), providers.KindNotFound, []string{"status", "i-3", "no such machine"}},
		{"typed keeps a provider error", p.Typed(Reboot, "i-4", already), providers.KindPermanent, []string{"bad kernel"}},
		{"typed wraps anything else as transient", p.Typed(Reboot, "i-5", context.Canceled), providers.KindTransient, []string{"reboot", "i-5"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if k := providers.KindOf(tt.err); k != tt.kind {
				t.Errorf("kind %s, want %s", k, tt.kind)
			}
			for _, s := range tt.say {
				if !strings.Contains(tt.err.Error(), s) {
					t.Errorf("%q does not say %q", tt.err, s)
				}
			}
		})
	}
	if !errors.Is(p.Typed(Reboot, "i-5", context.Canceled), context.Canceled) {
		t.Error("a wrapped error does not unwrap to its cause")
	}
}
