package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/tetherfleet/tether/controlplane/netboot/pxe"
	"github.com/tetherfleet/tether/controlplane/pool"
	"github.com/tetherfleet/tether/controlplane/retention"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/qemu"
)

// ServeOptions configure Serve. What a replica is (its data dir, store,
// artifacts and signers) sits at the top; the rest is grouped by what it
// tunes, so a flag's home is found by its subject.
type ServeOptions struct {
	DataDir string
	// Store is "", "sqlite" or a postgres:// URL.
	Store string
	// SigningKeyFiles are Ed25519 public keys (raw 32 bytes or PEM) that
	// module signatures may verify with.
	SigningKeyFiles []string
	// Kernel and Initramfs are the default netboot artifacts, ingested into
	// the blob store at start-up (templates may name others by digest).
	Kernel, Initramfs string
	// UKIs are TEMPLATE=FILE: the signed unified kernel image machines of
	// that template boot (ADR 0035), ingested into the blob store at
	// start-up and served by the netboot server.
	UKIs []string
	// SelfInstanceIDs are instances hosting this control plane (drain
	// refuses them).
	SelfInstanceIDs []string
	// Replica names this replica in agent presence (default: the host
	// name and the gRPC listen address).
	Replica string

	Clock clock.Clock
	Log   *slog.Logger
	// ReloadServerCert loads the server certificate files again at once
	// (tetherd sends SIGHUP's here); they are also checked for a change
	// every Loops.ServerCertCheck.
	ReloadServerCert <-chan struct{}

	Listeners ListenOptions
	Providers ProviderOptions
	Liveness  LivenessOptions
	Loops     LoopOptions
	Limits    LimitOptions
	// Retention is how long records are kept; zero windows take
	// retention's defaults (events 90 and 365 days by severity).
	Retention retention.Policy
	Test      TestHooks
}

// ListenOptions are where tetherd listens and how machines reach it.
type ListenOptions struct {
	// GRPC is the gRPC address (default 127.0.0.1:7443).
	GRPC string
	// Metrics serves Prometheus metrics ("" = off).
	Metrics string
	// Pprof serves /debug/pprof on the metrics listener (--pprof; off by
	// default: goroutine dumps and profiles are for whoever can reach it).
	Pprof bool
	// Netboot serves the artifacts and per-instance iPXE scripts over
	// HTTP ("" = off).
	Netboot string
	// AgentURL is the control plane address handed to agents; default
	// https://10.0.2.2:<port>, how a QEMU user-networking guest reaches us.
	AgentURL string
	// NetbootURL is the netboot server as machines reach it; default
	// http://10.0.2.2:<port>, like AgentURL.
	NetbootURL string
	// NetbootAnnounce boots unknown machines into the agent's announce
	// mode instead of refusing them (docs/adr/0030).
	NetbootAnnounce bool
	// PXE is firmware netboot: DHCP on an interface, TFTP of the iPXE
	// loaders (off unless PXE.Interface is set; needs the netboot server).
	PXE pxe.Options
}

// ProviderOptions configure the built-in providers.
type ProviderOptions struct {
	QEMU    QEMUOptions
	Redfish RedfishOptions
	// Libvirt is off unless Libvirt.URI is set.
	Libvirt LibvirtOptions
}

// QEMUOptions are tetherd's --qemu-* flags.
type QEMUOptions struct {
	// Mode is real (the default), recorder or disabled; anything else
	// fails at start-up.
	Mode string
	// StateDir holds the per-instance directories (default
	// DATA/machines). QMP sockets live in it, so it must be short.
	StateDir string
	// Boot is direct (the default: kernel, initramfs and token handed to
	// QEMU), bios or uefi (firmware netboot through the NIC's iPXE), or
	// uefi-http (OVMF's own HTTP Boot of the template's signed image).
	Boot string
	// SecureBoot boots OVMF with Secure Boot on (the secboot firmware and
	// a copy of the snakeoil-key variable store).
	SecureBoot bool
	// Tap puts VMs on this tap device instead of QEMU's user-mode
	// network (one VM at a time).
	Tap string
	// TPM gives every VM a TPM (swtpm); tetherd refuses to start with it
	// when swtpm is missing.
	TPM bool
}

// RedfishOptions tune the redfish provider: how long a stop waits for a
// graceful shutdown before forcing the power off, how long an action
// waits for PowerState to show it, and the bound on one BMC request
// (zero: the provider's defaults, 60 s, 60 s and 15 s).
type RedfishOptions struct {
	GracefulTimeout, PowerTimeout, RequestTimeout time.Duration
}

// LivenessOptions are how tetherd judges its agents and its replicas.
type LivenessOptions struct {
	// HeartbeatFlush is how often coalesced heartbeats are written
	// (default 1 s).
	HeartbeatFlush time.Duration
	// AgentSweep is how often one query looks for agent work whose
	// notification was lost (default agenthub.DefaultSweep).
	AgentSweep time.Duration
	// SilentAfter and PresumedDeadAfter are the liveness thresholds for a
	// small fleet (defaults 3 and 10 minutes); both stretch with its size.
	SilentAfter, PresumedDeadAfter time.Duration
	// BootTimeout errors a boot that makes no progress (default 15 min).
	BootTimeout time.Duration
	// SwitchTimeout errors a boot whose agent does not come back after
	// the switch into the root's init (default 3 min).
	SwitchTimeout time.Duration
	// PresenceLease is how long a presence stands unrenewed (default
	// 15 s): a crashed replica's members stop being claimable within it
	// (design §2.10).
	PresenceLease time.Duration
}

// LoopOptions are the cadence of the background work.
type LoopOptions struct {
	// Every is the tick of the short loops: task leases, the terminate
	// reconciler, the provision sweeper, liveness, refusal flushes
	// (default 5 s).
	Every time.Duration
	// ProviderSyncEvery is how often rows are compared with the providers'
	// machines (default 1 minute).
	ProviderSyncEvery time.Duration
	// TerminateResumeAfter is how old an unfinished terminate intent must
	// be before the periodic reconciler resumes it (default 1 minute); at
	// start-up every intent is resumed.
	TerminateResumeAfter time.Duration
	// WorkerLease and WorkerPoll tune the provider-work task leases
	// (defaults 60 s and 5 s).
	WorkerLease, WorkerPoll time.Duration
	// PoolReaperEvery is the pool reaper's tick (default 60 s).
	PoolReaperEvery time.Duration
	// ServerCertCheck is how often the server certificate's files are
	// checked for a change (default 10 s).
	ServerCertCheck time.Duration
}

// LimitOptions bound what the unauthenticated world can spend.
type LimitOptions struct {
	// MaxAgentConnections caps the connections the gRPC port holds;
	// zero means the descriptor limit minus FDReserve, negative no cap.
	MaxAgentConnections int
	// FDReserve is the descriptors kept for the store, the listeners, the
	// providers and module files (default DefaultFDReserve).
	FDReserve int
	// MaxUnauthenticatedPerSource caps connections per source address that
	// have not finished their TLS handshake (default 128; negative: no cap).
	MaxUnauthenticatedPerSource int
	// HandshakeTimeout bounds a connection's TLS and HTTP/2 handshakes
	// (default api.DefaultHandshakeTimeout).
	HandshakeTimeout time.Duration
	// UnauthenticatedAge bounds a gRPC connection without a CA-signed
	// client certificate (default api.DefaultUnauthenticatedAge).
	UnauthenticatedAge time.Duration
	// UnauthenticatedRate and UnauthenticatedBurst limit the requests
	// that need no credential (Enroll, netboot scripts) per source address:
	// Burst at once, Rate per second on average (defaults 20 and 200: a
	// few hundred machines behind one NAT can boot together). A negative
	// rate turns the limit off (load tests from one host).
	UnauthenticatedRate  float64
	UnauthenticatedBurst int
}

// TestHooks are for tests, chaos runs and measurements, never for a
// production replica.
type TestHooks struct {
	// Listener, MetricsListener and NetbootListener, when set, are used
	// instead of the addresses in Listeners.
	Listener, MetricsListener, NetbootListener net.Listener
	// WrapStore, when set, wraps the opened store (tests watch its use).
	WrapStore func(store.Store) store.Store
	// Providers are added to the built-in ones, each replacing a built-in
	// of the same name: tests inject the fake here, and so does
	// --provider-fake for chaos runs.
	Providers []providers.Provider
	// DisableAudit turns the audit trail off; it exists to measure the
	// trail's cost.
	DisableAudit bool
	// Ready, if set, receives the listening address once serving.
	Ready chan<- string
}

func (o *ServeOptions) defaults() error {
	if o.DataDir == "" {
		return errors.New("serve: --data-dir is required")
	}
	// Paths derived from the data dir are handed to other processes (QEMU
	// runs in its instance's directory), so they must not be relative.
	abs, err := filepath.Abs(o.DataDir)
	if err != nil {
		return fmt.Errorf("serve: --data-dir %q: %w", o.DataDir, err)
	}
	o.DataDir = abs
	if o.Listeners.GRPC == "" {
		o.Listeners.GRPC = "127.0.0.1:7443"
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if err := o.connectionBudget(); err != nil {
		return err
	}
	if o.Liveness.HeartbeatFlush <= 0 {
		o.Liveness.HeartbeatFlush = time.Second
	}
	if o.Loops.Every <= 0 {
		o.Loops.Every = 5 * time.Second
	}
	if o.Loops.ProviderSyncEvery <= 0 {
		o.Loops.ProviderSyncEvery = time.Minute
	}
	if o.Loops.TerminateResumeAfter <= 0 {
		o.Loops.TerminateResumeAfter = time.Minute
	}
	if o.Providers.QEMU.Mode == "" {
		o.Providers.QEMU.Mode = string(qemu.ModeReal)
	}
	if o.Loops.PoolReaperEvery <= 0 {
		o.Loops.PoolReaperEvery = pool.DefaultReaperEvery
	}
	if o.Limits.UnauthenticatedRate == 0 {
		o.Limits.UnauthenticatedRate = 20
	}
	if o.Limits.UnauthenticatedBurst <= 0 {
		o.Limits.UnauthenticatedBurst = 200
	}
	if o.Loops.ServerCertCheck <= 0 {
		o.Loops.ServerCertCheck = 10 * time.Second
	}
	if o.Listeners.AgentURL == "" {
		addr := o.Listeners.GRPC
		if o.Test.Listener != nil {
			addr = o.Test.Listener.Addr().String()
		}
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			return fmt.Errorf("serve: --listen %q: %w", addr, err)
		}
		o.Listeners.AgentURL = "https://10.0.2.2:" + port
	}
	return nil
}

// DefaultFDReserve is what the connection budget leaves for everything
// that is not an agent connection: the store's pool (SQLite's WAL and
// shared memory files, or PostgreSQL connections and the listener), the
// gRPC, metrics and netboot listeners, QEMU's sockets and module blobs
// being served. With this machine's limit of 20,000 descriptors that
// leaves 18,976 agent connections.
const DefaultFDReserve = 1024

// DefaultMaxUnauthenticatedPerSource lets a NAT gateway's agents reconnect
// together while one address cannot hold more descriptors than this in
// unfinished handshakes.
const DefaultMaxUnauthenticatedPerSource = 128

// connectionBudget derives the agent connection cap from the descriptor
// limit (Go raises the soft limit to the hard one at start-up), so that
// agents can never take the descriptors an internal write needs.
func (o *ServeOptions) connectionBudget() error {
	if o.Limits.FDReserve <= 0 {
		o.Limits.FDReserve = DefaultFDReserve
	}
	if o.Limits.MaxUnauthenticatedPerSource == 0 {
		o.Limits.MaxUnauthenticatedPerSource = DefaultMaxUnauthenticatedPerSource
	}
	if o.Limits.MaxAgentConnections != 0 {
		return nil
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("serve: read the descriptor limit for --max-agent-connections: %w", err)
	}
	if lim.Cur > 1<<30 { // unlimited, in effect
		o.Limits.MaxAgentConnections = -1
		return nil
	}
	o.Limits.MaxAgentConnections = int(lim.Cur) - o.Limits.FDReserve
	if o.Limits.MaxAgentConnections < 1 {
		return fmt.Errorf("serve: the descriptor limit %d leaves no agent connections after --fd-reserve %d; raise the limit (ulimit -n) or lower the reserve", lim.Cur, o.Limits.FDReserve)
	}
	return nil
}
