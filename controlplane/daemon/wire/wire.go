// Package wire builds the control plane's services once, the same way for
// tetherd and for the tests that need them together: NewServices is the
// one place that knows which service is handed to which, so a test
// fixture cannot drift from what tetherd runs.
//
// It builds what sits below the API (the API server, the agent hub and
// the listeners are tetherd's: controlplane/daemon). It is its own
// package, not part of daemon, because the fixtures that use it
// (instancestest, the pool and netboot tests) must not link daemon: daemon
// imports the API, both store backends and every provider.
package wire

import (
	"crypto/ed25519"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/tetherfleet/tether/controlplane/catalog"
	"github.com/tetherfleet/tether/controlplane/certificates"
	"github.com/tetherfleet/tether/controlplane/enroll"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/liveness"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/pool"
	"github.com/tetherfleet/tether/controlplane/presence"
	"github.com/tetherfleet/tether/controlplane/provsync"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/tasks"
	"github.com/tetherfleet/tether/controlplane/worker"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/pki/ca"
	"github.com/tetherfleet/tether/providers"
)

// Deps are what the services are built over. Every field above Tuning is
// required: NewServices names a missing one rather than building a
// service that fails on first use.
type Deps struct {
	Store store.Store
	Clock clock.Clock
	Log   *slog.Logger
	// Machines are the providers by name.
	Machines map[string]providers.Provider
	// CA signs node certificates; its fingerprint is handed to every boot.
	CA *ca.CA
	// Blobs hold modules and the netboot artifacts, by digest.
	Blobs *modules.Blobs
	// AgentURL is the control plane as agents reach it.
	AgentURL string

	// Kernel and Initramfs are the digests of the default netboot
	// artifacts ("" when none was given); NetbootURL is where machines
	// fetch them ("" when tetherd serves no netboot).
	Kernel, Initramfs, NetbootURL string
	// SigningKeys are the module signers configured at start-up.
	SigningKeys []ed25519.PublicKey
	// SelfInstanceIDs are instances hosting this control plane (drain
	// refuses them).
	SelfInstanceIDs []string
	// Replica names this replica in agent presence.
	Replica string
	// MeasuredBoot, when set, checks an attested node booted its
	// template's signed image (nil: no template has one).
	MeasuredBoot enroll.MeasuredBoot
	Tuning       Tuning
}

// Tuning are the knobs of the services; zero takes each service's default.
type Tuning struct {
	// Owner names this replica in the leases of the provider operations
	// the instance service runs inside API calls, WorkerOwner in those
	// its worker takes (defaults: worker.NewOwner of "tetherd-api" and
	// "tetherd-worker").
	Owner, WorkerOwner string
	// WorkerLease and WorkerPoll tune the provider-work task leases.
	WorkerLease, WorkerPoll time.Duration
	// SilentAfter and PresumedDeadAfter are the liveness thresholds;
	// SilentAfter is also when a pool member's heartbeat is stale.
	SilentAfter, PresumedDeadAfter time.Duration
	// BootTimeout and SwitchTimeout error a boot that stalls.
	BootTimeout, SwitchTimeout time.Duration
	// MaxHeartbeatsPerSecond is the agent API's heartbeat budget, by
	// which liveness and the pools stretch their thresholds with the
	// fleet (zero: liveness.DefaultMaxHeartbeatsPerSecond).
	MaxHeartbeatsPerSecond float64
	// PresenceLease is how long a presence stands unrenewed.
	PresenceLease time.Duration
	// StreamLostConfirm is how long a dropped stream waits for its agent
	// before the provider is asked about its machine (default
	// DefaultStreamLostConfirm).
	StreamLostConfirm time.Duration
	// OpTimeout, ProvisionAttempts and RetryBackoff shape the instance
	// service's provider calls (tests shorten them).
	OpTimeout         time.Duration
	ProvisionAttempts int
	RetryBackoff      time.Duration
}

// DefaultStreamLostConfirm lets an agent whose stream dropped reconnect
// before the provider is asked about its machine.
const DefaultStreamLostConfirm = 2 * time.Second

// Services are the control plane's services, each built once and handed
// to those that use it at construction.
type Services struct {
	Tasks     *tasks.Service
	Instances *instances.Service
	// Worker runs the provider work the instance service queues.
	Worker *worker.Worker
	// Pools replenish on the nudges the instance service sends them
	// (pool.Nudges, made before both).
	Pools    *pool.Service
	Liveness *liveness.Sensor
	Sync     *provsync.Syncer
	// Checks ask the provider at once about a machine whose death was
	// signalled (a provider's exit, a dropped stream; design §2.7).
	Checks       *provsync.Checks
	Presence     *presence.Tracker
	Enroll       *enroll.Service
	Catalog      *catalog.Service
	Certificates *certificates.Service
	Registry     *modules.Registry
	// Ready is what the agent API calls on an agent's ready report: the
	// instance service with the pool's hook (a warming member becomes
	// ready in the same transaction).
	Ready instances.Readiness
}

// NewServices builds every service over d.
func NewServices(d Deps) (*Services, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	t := d.Tuning
	if t.Owner == "" {
		t.Owner = worker.NewOwner("tetherd-api")
	}
	if t.WorkerOwner == "" {
		t.WorkerOwner = worker.NewOwner("tetherd-worker")
	}
	if t.StreamLostConfirm <= 0 {
		t.StreamLostConfirm = DefaultStreamLostConfirm
	}
	st, clk, log := d.Store, d.Clock, d.Log
	s := &Services{
		Tasks:        &tasks.Service{Store: st, Clock: clk, Log: log},
		Presence:     &presence.Tracker{Store: st, Clock: clk, Log: log, Lease: t.PresenceLease, Replica: d.Replica},
		Enroll:       &enroll.Service{Store: st, CA: d.CA, Clock: clk, Log: log, MeasuredBoot: d.MeasuredBoot},
		Catalog:      &catalog.Service{Store: st, Clock: clk},
		Certificates: &certificates.Service{Store: st, Clock: clk, CA: d.CA},
		Registry:     &modules.Registry{Store: st, Blobs: d.Blobs, Clock: clk, Log: log, StaticSigners: d.SigningKeys},
	}
	// The pool service replenishes on nudges the instance service sends:
	// the queue between them is made first, so neither is patched later.
	nudges := pool.NewNudges()
	s.Instances = &instances.Service{Store: st, Clock: clk, Log: log, Machines: d.Machines, Pools: nudges,
		Artifacts: &instances.Artifacts{Blobs: d.Blobs, Kernel: d.Kernel, Initramfs: d.Initramfs, BaseURL: strings.TrimSuffix(d.NetbootURL, "/")},
		AgentURL:  d.AgentURL, CAFingerprint: d.CA.Fingerprint(), CA: d.CA, SelfInstanceIDs: d.SelfInstanceIDs,
		Owner: t.Owner, Lease: t.WorkerLease, OpTimeout: t.OpTimeout, ProvisionAttempts: t.ProvisionAttempts, RetryBackoff: t.RetryBackoff}
	s.Worker = &worker.Worker{Store: st, Clock: clk, Log: log.With("component", "worker"), Owner: t.WorkerOwner,
		Lease: t.WorkerLease, Poll: t.WorkerPoll, Handlers: s.Instances.Handlers()}
	s.Pools = &pool.Service{Store: st, Clock: clk, Log: log.With("component", "pool"), Instances: s.Instances,
		StaleHeartbeatAfter: t.SilentAfter, MaxHeartbeatsPerSecond: t.MaxHeartbeatsPerSecond, Nudges: nudges}
	s.Ready = instances.Readiness{Instances: s.Instances, Hooks: []instances.ReadyHook{s.Pools.ReadyHook}}
	s.Liveness = &liveness.Sensor{Store: st, Clock: clk, Log: log, Instances: s.Instances, SilentAfter: t.SilentAfter,
		DeadAfter: t.PresumedDeadAfter, MaxHeartbeatsPerSecond: t.MaxHeartbeatsPerSecond, BootTimeout: t.BootTimeout, SwitchTimeout: t.SwitchTimeout}
	s.Sync = &provsync.Syncer{Store: st, Clock: clk, Log: log, Instances: s.Instances, StreamLostConfirm: t.StreamLostConfirm}
	s.Checks = &provsync.Checks{Syncer: s.Sync}
	return s, nil
}

// check names the first required dependency that is missing.
func (d Deps) check() error {
	var missing []string
	for _, r := range []struct {
		name   string
		absent bool
	}{{"Store", d.Store == nil}, {"Clock", d.Clock == nil}, {"Log", d.Log == nil}, {"Machines", len(d.Machines) == 0},
		{"CA", d.CA == nil}, {"Blobs", d.Blobs == nil}, {"AgentURL", d.AgentURL == ""}} {
		if r.absent {
			missing = append(missing, r.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("wire: missing Deps.%s", strings.Join(missing, ", Deps."))
	}
	return nil
}
