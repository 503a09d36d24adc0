package daemon

import (
	"context"
	"fmt"

	"github.com/tetherfleet/tether/controlplane/api"
	"github.com/tetherfleet/tether/controlplane/bmc"
	"github.com/tetherfleet/tether/controlplane/credentials"
	"github.com/tetherfleet/tether/controlplane/daemon/wire"
	"github.com/tetherfleet/tether/controlplane/enroll"
	"github.com/tetherfleet/tether/providers"
)

// buildMachines builds the providers. The redfish provider finds a
// node's BMC, and its sealed credential, through the store, so the
// credentials service comes first.
func (d *daemon) buildMachines(context.Context) error {
	o := &d.o
	d.creds = &credentials.Service{Store: d.st, Clock: o.Clock, Sealer: d.sealer}
	var err error
	if d.machines, err = buildProviders(*o, d.log, o.Clock, &bmc.Resolver{Store: d.st, Credentials: d.creds, Clock: o.Clock, Log: d.log}); err != nil {
		return err
	}
	// A provider that reports a machine's exit is a death signal: run
	// hands it to the death checks (design §2.7).
	for _, p := range d.machines {
		if w, ok := p.(providers.ExitWatcher); ok {
			d.exitWatchers = append(d.exitWatchers, w)
		}
	}
	return nil
}

// buildServices builds every service once, as the tests' fixtures do.
func (d *daemon) buildServices(context.Context) error {
	o := &d.o
	var err error
	var measured enroll.MeasuredBoot
	if p := d.ukis.Policy(d.st); p != nil {
		measured = p // a nil *Policy in the interface would not read as nil
	}
	d.svc, err = wire.NewServices(wire.Deps{MeasuredBoot: measured, Store: d.st, Clock: o.Clock, Log: d.log, Machines: d.machines,
		CA: d.authority, Blobs: d.blobs, AgentURL: o.Listeners.AgentURL,
		Kernel: d.kernel, Initramfs: d.initramfs, NetbootURL: o.Listeners.NetbootURL,
		SigningKeys: edKeys(d.signingKeys), SelfInstanceIDs: o.SelfInstanceIDs, Replica: o.replica(d.lis.Addr().String()),
		Tuning: wire.Tuning{WorkerLease: o.Loops.WorkerLease, WorkerPoll: o.Loops.WorkerPoll,
			SilentAfter: o.Liveness.SilentAfter, PresumedDeadAfter: o.Liveness.PresumedDeadAfter,
			BootTimeout: o.Liveness.BootTimeout, SwitchTimeout: o.Liveness.SwitchTimeout,
			MaxHeartbeatsPerSecond: api.MaxHeartbeatsPerSecond, PresenceLease: o.Liveness.PresenceLease}})
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}
