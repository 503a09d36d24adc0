package qemu

import (
	"errors"

	"github.com/tetherfleet/tether/providers"
)

// Provider operation names, as they appear in errors and recorder entries.
const (
	opProvision = "provision"
	opStart     = "start"
	opStop      = "stop"
	opReboot    = "reboot"
	opTerminate = "terminate"
	opStatus    = "status"
	opList      = "list"
)

func provErr(kind providers.Kind, op, id string, err error) error {
	return providers.MachineError(kind, Name, op, id, err)
}

func permanent(op, id string, err error) error {
	return provErr(providers.KindPermanent, op, id, err)
}

func transient(op, id string, err error) error {
	return provErr(providers.KindTransient, op, id, err)
}

func notFound(op, id string) error {
	return provErr(providers.KindNotFound, op, id, errors.New("no such machine"))
}

// typed keeps an error that is already a provider error and wraps any other
// one as transient: a retry is the safe default for a failure we cannot name
// (a cancelled context included).
func typed(op, id string, err error) error {
	var pe *providers.Error
	if errors.As(err, &pe) {
		return err
	}
	return transient(op, id, err)
}
