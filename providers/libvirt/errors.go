package libvirt

import (
	"errors"
	"fmt"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/internal/operr"
)

// errs makes this provider's typed errors.
const errs = operr.For(Name)

func notFound(op, id string) error { return errs.NotFound(op, id, "no such domain") }

// libvirtCode returns the libvirt error number of err, if it is one.
func libvirtCode(err error) (golibvirt.ErrorNumber, bool) {
	var le golibvirt.Error
	if errors.As(err, &le) {
		return golibvirt.ErrorNumber(le.Code), true
	}
	return 0, false
}

func isCode(err error, code golibvirt.ErrorNumber) bool {
	c, ok := libvirtCode(err)
	return ok && c == code
}

// kindOf classifies a libvirt failure. Input libvirtd refuses (the XML,
// an argument, a feature this libvirtd or QEMU lacks, a file it cannot
// open) will be refused again, so it is permanent; a daemon that is away,
// busy or slow is transient; so is anything we cannot name (a retry is
// the safe default).
func kindOf(err error) providers.Kind {
	var pe *providers.Error
	if errors.As(err, &pe) {
		return pe.Kind
	}
	code, ok := libvirtCode(err)
	if !ok {
		// Connection failures, ErrInterrupted, a session that timed out.
		return providers.KindTransient
	}
	switch code {
	case golibvirt.ErrNoDomain:
		return providers.KindNotFound
	case golibvirt.ErrNoSupport, golibvirt.ErrInvalidArg, golibvirt.ErrXMLError, golibvirt.ErrXMLDetail,
		golibvirt.ErrXMLInvalidSchema, golibvirt.ErrConfigUnsupported, golibvirt.ErrArgumentUnsupported,
		golibvirt.ErrOperationUnsupported, golibvirt.ErrOsType, golibvirt.ErrNoKernel, golibvirt.ErrNoOs,
		golibvirt.ErrInvalidMac, golibvirt.ErrNoNetwork, golibvirt.ErrOperationDenied, golibvirt.ErrAuthFailed,
		golibvirt.ErrAccessDenied, golibvirt.ErrDomExist, golibvirt.ErrOpenFailed, golibvirt.ErrCPUIncompatible,
		golibvirt.ErrNoSecurityModel:
		return providers.KindPermanent
	case golibvirt.ErrNoMemory, golibvirt.ErrDriverFull:
		return providers.KindQuota
	}
	return providers.KindTransient
}

// wrap types a libvirt failure of op.
func wrap(op, id, what string, err error) error {
	var pe *providers.Error
	if errors.As(err, &pe) {
		return err
	}
	return errs.Err(kindOf(err), op, id, fmt.Errorf("%s: %w", what, err))
}
