package qemu

import (
	"github.com/tetherfleet/tether/providers/internal/operr"
)

// errs makes this provider's typed errors.
const errs = operr.For(Name)

func notFound(op, id string) error { return errs.NotFound(op, id, "no such machine") }
