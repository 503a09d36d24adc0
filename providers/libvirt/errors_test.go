package libvirt

import (
	"context"
	"errors"
	"fmt"
	"testing"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/tetherfleet/tether/providers"
)

func TestKindOf(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want providers.Kind
	}{
		{"no domain", lverr(golibvirt.ErrNoDomain, "Domain not found"), providers.KindNotFound},
		{"bad XML", lverr(golibvirt.ErrXMLDetail, "XML error"), providers.KindPermanent},
		{"schema", lverr(golibvirt.ErrXMLInvalidSchema, "does not validate"), providers.KindPermanent},
		{"unsupported config", lverr(golibvirt.ErrConfigUnsupported, "unsupported configuration: fwcfg"), providers.KindPermanent},
		{"no such network", lverr(golibvirt.ErrNoNetwork, "Network not found"), providers.KindPermanent},
		{"denied", lverr(golibvirt.ErrAccessDenied, "access denied"), providers.KindPermanent},
		{"auth", lverr(golibvirt.ErrAuthFailed, "authentication failed"), providers.KindPermanent},
		{"cannot open a file", lverr(golibvirt.ErrOpenFailed, "cannot open file"), providers.KindPermanent},
		{"out of memory", lverr(golibvirt.ErrNoMemory, "out of memory"), providers.KindQuota},
		{"busy", lverr(golibvirt.ErrResourceBusy, "busy"), providers.KindTransient},
		{"timeout", lverr(golibvirt.ErrOperationTimeout, "cannot acquire state change lock"), providers.KindTransient},
		{"internal", lverr(golibvirt.ErrInternalError, "process exited while connecting to monitor"), providers.KindTransient},
		{"rpc", lverr(golibvirt.ErrRPC, "End of file while reading data"), providers.KindTransient},
		{"interrupted", golibvirt.ErrInterrupted, providers.KindTransient},
		{"connection refused", errors.New("dial unix /var/run/libvirt/libvirt-sock: connect: connection refused"), providers.KindTransient},
		{"session ended", fmt.Errorf("%w: %w", errSessionEnded, context.DeadlineExceeded), providers.KindTransient},
		{"wrapped libvirt error", fmt.Errorf("define: %w", lverr(golibvirt.ErrXMLError, "x")), providers.KindPermanent},
		{"already typed", errs.Permanent("start", "i", errors.New("x")), providers.KindPermanent},
	}
	for _, tc := range cases {
		if got := kindOf(tc.err); got != tc.want {
			t.Errorf("%s: kindOf = %s, want %s", tc.name, got, tc.want)
		}
		// wrap keeps the kind and libvirt's words.
		w := wrap("start", "i-1", "start domain", tc.err)
		if got := providers.KindOf(w); got != tc.want {
			t.Errorf("%s: wrapped kind = %s, want %s", tc.name, got, tc.want)
		}
		var pe *providers.Error
		if !errors.As(w, &pe) || pe.Provider != Name || pe.Op != "start" {
			t.Errorf("%s: wrap = %#v, want a libvirt start error", tc.name, w)
		}
	}
}
