// Package operr builds the typed errors of a provider's operations, so
// that the providers that share the same vocabulary (qemu, libvirt) do not
// each keep a copy of it. Every error is a *providers.Error naming the
// provider, the operation and the machine.
package operr

import (
	"errors"

	"github.com/tetherfleet/tether/providers"
)

// Operation names, as they appear in errors and recorder entries.
const (
	Provision = "provision"
	Start     = "start"
	Stop      = "stop"
	Reboot    = "reboot"
	Terminate = "terminate"
	Status    = "status"
	List      = "list"
)

// For is a provider's name; its methods make that provider's errors.
type For string

// Err is an error of kind for op on machine id.
func (p For) Err(kind providers.Kind, op, id string, err error) error {
	return providers.MachineError(kind, string(p), op, id, err)
}

// Permanent is a failure a retry will meet again.
func (p For) Permanent(op, id string, err error) error {
	return p.Err(providers.KindPermanent, op, id, err)
}

// Transient is a failure a retry may not meet.
func (p For) Transient(op, id string, err error) error {
	return p.Err(providers.KindTransient, op, id, err)
}

// NotFound says machine id does not exist; what names the machine in the
// provider's own words ("no such domain").
func (p For) NotFound(op, id, what string) error {
	return p.Err(providers.KindNotFound, op, id, errors.New(what))
}

// Typed keeps an error that is already a provider error and wraps any
// other one as transient: a retry is the safe default for a failure that
// cannot be named (a cancelled context included).
func (p For) Typed(op, id string, err error) error {
	var pe *providers.Error
	if errors.As(err, &pe) {
		return err
	}
	return p.Transient(op, id, err)
}
