package providers

import "context"

// Exit is a provider's own observation that a machine stopped running: a
// child process it reaped, a hypervisor's lifecycle event. It is a cue to
// ask Status at once, not a verdict: the caller moves a row only on what
// Status then reports (docs/design.md §2.6, §2.7).
type Exit struct {
	// MachineID is the provider's id (cloud_instance_id), and InstanceID
	// the Tether instance it runs for (providers name machines after it).
	MachineID, InstanceID string
	// Detail says what was observed, e.g. "qemu killed by signal 9 (exit
	// status 137)".
	Detail string
}

// ExitWatcher is a provider that observes its machines' exits as they
// happen. Providers without it are observed by the periodic provider
// sync and by their agents' streams dropping.
type ExitWatcher interface {
	// WatchExits hands every later exit to f until ctx ends, and returns
	// at once. f is called from the provider's own goroutine and must not
	// block.
	WatchExits(ctx context.Context, f func(Exit))
}

// ExitReporter is a provider that can tell, from what it holds on this
// host (the exit of a child it reaped, a local state file), that a machine
// has stopped running, with no round trip to a BMC or a remote API. The
// answer is cheap enough for a claim to ask inside its transaction, so a
// claim never hands out a member whose machine this provider already saw
// exit, whatever the row and the presence lease still say. Providers that
// must ask over the network (redfish) do not implement it: their deaths
// reach the row through their agents' streams and provider sync.
type ExitReporter interface {
	// Exited reports whether machine id is known to have exited, and
	// what was observed. Not knowing is false: the claim then rests on
	// the row and the presence lease.
	Exited(id string) (detail string, exited bool)
}
