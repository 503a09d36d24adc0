package qemu

import (
	"github.com/tetherfleet/tether/providers/internal/operr"
)

// errs makes this provider's typed errors.
const errs = operr.For(Name)

// Operation names, as they appear in errors and recorder entries.
const (
	opProvision = operr.Provision
	opStart     = operr.Start
	opStop      = operr.Stop
	opReboot    = operr.Reboot
	opTerminate = operr.Terminate
	opStatus    = operr.Status
	opList      = operr.List
)

func notFound(op, id string) error { return errs.NotFound(op, id, "no such machine") }
