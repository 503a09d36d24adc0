package daemon

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/tetherfleet/tether/controlplane/api"
	"github.com/tetherfleet/tether/controlplane/audit"
	"github.com/tetherfleet/tether/controlplane/bmc"
	"github.com/tetherfleet/tether/controlplane/carotation"
	"github.com/tetherfleet/tether/controlplane/catalog"
	"github.com/tetherfleet/tether/controlplane/certificates"
	"github.com/tetherfleet/tether/controlplane/certreload"
	"github.com/tetherfleet/tether/controlplane/credentials"
	"github.com/tetherfleet/tether/controlplane/enroll"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/liveness"
	"github.com/tetherfleet/tether/controlplane/loops"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/netboot"
	"github.com/tetherfleet/tether/controlplane/netboot/pxe"
	"github.com/tetherfleet/tether/controlplane/pool"
	"github.com/tetherfleet/tether/controlplane/presence"
	"github.com/tetherfleet/tether/controlplane/provsync"
	"github.com/tetherfleet/tether/controlplane/retention"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/controlplane/tasks"
	"github.com/tetherfleet/tether/controlplane/throttle"
	"github.com/tetherfleet/tether/controlplane/worker"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/guard"
	"github.com/tetherfleet/tether/pki/ca"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/qemu"
)

// ServeOptions configure Serve.
type ServeOptions struct {
	DataDir string
	Listen  string // default 127.0.0.1:7443
	// Listener, when set, is used instead of Listen (tests).
	Listener net.Listener
	// Store is "", "sqlite" or a postgres:// URL.
	Store         string
	MetricsListen string
	// Pprof serves /debug/pprof on the metrics listener (--pprof; off by
	// default: goroutine dumps and profiles are for whoever can reach it).
	Pprof bool
	// AgentURL is the control plane address handed to agents; default
	// https://10.0.2.2:<port>, how a QEMU user-networking guest reaches us.
	AgentURL string
	// SigningKeyFiles are Ed25519 public keys (raw 32 bytes or PEM) that
	// module signatures may verify with.
	SigningKeyFiles []string

	// QEMUMode is real (the default), recorder or disabled; anything else
	// fails at start-up.
	QEMUMode string
	// QEMUStateDir holds the qemu provider's per-instance directories
	// (default DATA/machines). QMP sockets live in it, so it must be short.
	QEMUStateDir string
	// QEMUBoot is direct (the default: kernel, initramfs and token handed
	// to QEMU), bios or uefi (firmware netboot through the NIC's iPXE).
	QEMUBoot string
	// QEMUTap puts qemu VMs on this tap device instead of QEMU's user-mode
	// network (one VM at a time).
	QEMUTap string
	// QEMUTPM gives every qemu VM a TPM (swtpm); tetherd refuses to start
	// with it when swtpm is missing.
	QEMUTPM bool
	// Redfish tunes the redfish provider: how long a stop waits for a
	// graceful shutdown before forcing the power off, how long an action
	// waits for PowerState to show it, and the bound on one BMC request
	// (zero: the provider's defaults, 60 s, 60 s and 15 s).
	RedfishGracefulTimeout, RedfishPowerTimeout, RedfishRequestTimeout time.Duration
	// Libvirt configures the libvirt provider; it is off unless
	// Libvirt.URI is set.
	Libvirt LibvirtOptions
	// Kernel and Initramfs are the default netboot artifacts, ingested into
	// the blob store at start-up (templates may name others by digest).
	Kernel, Initramfs string
	// NetbootListen serves the artifacts and per-instance iPXE scripts
	// over HTTP ("" = off); NetbootListener is used instead when set.
	NetbootListen   string
	NetbootListener net.Listener
	// MetricsListener, when set, is used instead of MetricsListen (tests).
	MetricsListener net.Listener
	// WrapStore, when set, wraps the opened store (tests watch its use).
	WrapStore func(store.Store) store.Store
	// NetbootURL is the netboot server as machines reach it; default
	// http://10.0.2.2:<port>, like AgentURL.
	NetbootURL string
	// PXE is firmware netboot: DHCP on an interface, TFTP of the iPXE
	// loaders (off unless PXE.Interface is set; needs the netboot server).
	PXE pxe.Options
	// Providers are added to the built-in ones (external, qemu), each
	// replacing a built-in of the same name. Tests inject the fake here.
	Providers []providers.Provider
	// SelfInstanceIDs are instances hosting this control plane (drain
	// refuses them).
	SelfInstanceIDs []string

	HeartbeatFlush time.Duration // default 1 s
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
	// AgentSweep is how often one query looks for agent work whose
	// notification was lost (default api.DefaultSweep).
	AgentSweep time.Duration
	LoopEvery  time.Duration // default 5 s
	// SilentAfter and PresumedDeadAfter are the liveness thresholds for a
	// small fleet (defaults 3 and 10 minutes); both stretch with its size.
	SilentAfter, PresumedDeadAfter time.Duration
	// BootTimeout errors a boot that makes no progress (default 15 min).
	BootTimeout time.Duration
	// SwitchTimeout errors a boot whose agent does not come back after
	// the switch into the root's init (default 3 min).
	SwitchTimeout time.Duration
	// ProviderSyncEvery is how often rows are compared with the providers'
	// machines (default 1 minute).
	ProviderSyncEvery time.Duration
	// Replica names this replica in agent presence (default: the host name
	// and the listen address); PresenceLease is how long a presence stands
	// unrenewed (default 15 s): a crashed replica's members stop being
	// claimable within it (design §2.10).
	Replica       string
	PresenceLease time.Duration
	// TerminateResumeAfter is how old an unfinished terminate intent must
	// be before the periodic reconciler resumes it (default 1 minute); at
	// start-up every intent is resumed.
	TerminateResumeAfter time.Duration
	// WorkerLease and WorkerPoll tune the provider-work task leases
	// (defaults 60 s and 5 s).
	WorkerLease, WorkerPoll time.Duration
	// PoolReaperEvery is the pool reaper's tick (default 60 s).
	PoolReaperEvery time.Duration
	// DisableAudit turns the audit trail off; it exists to measure the
	// trail's cost, not for production.
	DisableAudit bool
	// EventRetention: low/medium and high/critical windows (defaults 90 and 365 days).
	EventRetentionLow, EventRetentionHigh time.Duration

	// UnauthenticatedRate and UnauthenticatedBurst limit the requests
	// that need no credential (Enroll, netboot scripts) per source address:
	// Burst at once, Rate per second on average (defaults 20 and 200: a
	// few hundred machines behind one NAT can boot together). A negative
	// rate turns the limit off (load tests from one host).
	UnauthenticatedRate  float64
	UnauthenticatedBurst int

	Clock clock.Clock
	Log   *slog.Logger
	// Ready, if set, receives the listening address once serving.
	Ready chan<- string
	// ReloadServerCert loads the server certificate files again at once
	// (tetherd sends SIGHUP's here); they are also checked for a change
	// every ServerCertCheck (default 10 s).
	ReloadServerCert <-chan struct{}
	ServerCertCheck  time.Duration
}

// Serve runs the control plane until ctx ends, then stops it, in three
// phases: build opens everything (store, listeners, services) and fails
// before anything runs; run starts the workers and serves until ctx ends
// or a server fails; stop stops accepting, ends the streams, waits for
// every worker and closes the store last, whatever run returned.
func Serve(ctx context.Context, o ServeOptions) error {
	d, err := build(ctx, o)
	if err != nil {
		return err
	}
	err = d.run(ctx)
	d.stop()
	return err
}

// daemon is a built control plane: everything open, nothing running.
type daemon struct {
	o   ServeOptions
	log *slog.Logger
	st  store.Store

	lis, netLis, metricsLis net.Listener
	srv                     *api.Server
	metricsSrv              *http.Server
	netboot                 *netboot.Server
	pxe                     *pxe.Service

	hub            *api.AgentHub
	enrollSvc      *enroll.Service
	wk             *worker.Worker
	instSvc        *instances.Service
	taskSvc        *tasks.Service
	sensor         *liveness.Sensor
	syncer         *provsync.Syncer
	checks         *provsync.Checks
	exitWatchers   []providers.ExitWatcher
	presence       *presence.Tracker
	pools          *pool.Service
	revoked        *api.Revocations
	serverCert     *certreload.Reloader
	cas            *carotation.Service
	creds          *credentials.Service
	reloadFailures prometheus.Counter

	fingerprint, kernel, initramfs string

	// What run started and stop waits for.
	stopBG  context.CancelFunc
	workers []chan struct{}
}

// build opens and wires everything. On failure it closes what it opened.
func build(ctx context.Context, opts ServeOptions) (_ *daemon, err error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	d := &daemon{o: opts, log: opts.Log, lis: opts.Listener, netLis: opts.NetbootListener, metricsLis: opts.MetricsListener}
	// One copy of the options: what build derives (the netboot URL, say)
	// is what run and the daemon's parts read afterwards.
	o := &d.o
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	log := o.Log
	authority, err := ca.Load(filepath.Join(o.DataDir, CADir), o.Clock)
	if err != nil {
		return nil, fmt.Errorf("serve: %w (run `tetherd init --data-dir %s` first)", err, o.DataDir)
	}
	// The data dir's CA: the first of the rotation set, and the issuer of
	// the server certificate, whatever CA is active (design §3.10).
	first, firstKey := authority.Certificate(), authority.Key()
	if d.serverCert, err = certreload.New(filepath.Join(o.DataDir, ServerCertFile), filepath.Join(o.DataDir, ServerKeyFile), o.Clock, log); err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	st, err := OpenStore(ctx, o.Store, o.DataDir, log)
	if err != nil {
		return nil, err
	}
	if o.WrapStore != nil {
		st = o.WrapStore(st)
	}
	// Every write of an audited admin call appends its audit record in
	// the same transaction (controlplane/audit).
	if !o.DisableAudit {
		st = audit.Wrap(st)
	}
	d.st = st
	if err := recordRestore(ctx, st, o.DataDir, o.Clock.Now(), log); err != nil {
		return nil, err
	}
	sealer, created, err := credentials.LoadOrCreateKey(o.DataDir)
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	if created {
		log.Info("created the BMC credentials key (this data dir predates stored credentials); copy it to every replica's data dir",
			"file", filepath.Join(o.DataDir, credentials.KeyFile))
	}
	d.creds = &credentials.Service{Store: st, Clock: o.Clock, Sealer: sealer}
	blobs, err := modules.OpenBlobs(filepath.Join(o.DataDir, BlobDir))
	if err != nil {
		return nil, err
	}
	if n, err := blobs.SweepTmp(time.Hour, o.Clock.Now()); err != nil {
		log.Warn("removing uploads left by an interrupted push", "err", err)
	} else if n > 0 {
		log.Info("removed uploads left by an interrupted push", "count", n)
	}
	keys, err := loadSigningKeys(o.SigningKeyFiles)
	if err != nil {
		return nil, err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := adoptInitAdmin(ctx, st, authority, o.DataDir, o.Clock.Now(), log); err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	d.cas = &carotation.Service{Store: st, CA: authority, First: first, FirstKey: firstKey, Sealer: sealer, Clock: o.Clock, Log: log}
	if err := d.cas.Start(ctx); err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	d.fingerprint = authority.Fingerprint()
	// Every listener that serves untrusted input recovers its panics here.
	panics := guard.New(reg, log)
	d.revoked = api.NewRevocations()
	if err := d.revoked.Load(ctx, st, o.Clock.Now()); err != nil {
		return nil, fmt.Errorf("serve: load revocations: %w", err)
	}
	d.reloadFailures = api.NewReloadFailures(reg)
	machines, err := buildProviders(*o, log, o.Clock, &bmc.Resolver{Store: st, Credentials: d.creds, Clock: o.Clock, Log: log})
	if err != nil {
		return nil, err
	}
	if d.kernel, err = ingestArtifact(blobs, "--kernel", o.Kernel); err != nil {
		return nil, err
	}
	if d.initramfs, err = ingestArtifact(blobs, "--initramfs", o.Initramfs); err != nil {
		return nil, err
	}
	if d.netLis == nil && o.NetbootListen != "" {
		if d.netLis, err = net.Listen("tcp", o.NetbootListen); err != nil {
			return nil, fmt.Errorf("serve: netboot listen on %s: %w", o.NetbootListen, err)
		}
	}
	if err := o.pxeURL(d.netLis); err != nil {
		return nil, err
	}
	if d.netLis != nil && o.NetbootURL == "" {
		_, port, _ := net.SplitHostPort(d.netLis.Addr().String())
		o.NetbootURL = "http://10.0.2.2:" + port
	}
	d.taskSvc = &tasks.Service{Store: st, Clock: o.Clock, Log: log}
	// The pool service replenishes on nudges the instance service sends:
	// the queue between them is made first, so neither is patched later.
	nudges := pool.NewNudges()
	d.instSvc = &instances.Service{Store: st, Clock: o.Clock, Log: log, Machines: machines, Pools: nudges,
		Artifacts: &instances.Artifacts{Blobs: blobs, Kernel: d.kernel, Initramfs: d.initramfs, BaseURL: strings.TrimSuffix(o.NetbootURL, "/")},
		AgentURL:  o.AgentURL, CAFingerprint: authority.Fingerprint(), CA: authority,
		Owner: worker.NewOwner("tetherd-api"), Lease: o.WorkerLease, SelfInstanceIDs: o.SelfInstanceIDs}
	d.wk = &worker.Worker{Store: st, Clock: o.Clock, Log: log.With("component", "worker"), Owner: worker.NewOwner("tetherd-worker"),
		Lease: o.WorkerLease, Poll: o.WorkerPoll, Handlers: d.instSvc.Handlers()}
	d.sensor = &liveness.Sensor{Store: st, Clock: o.Clock, Log: log, Instances: d.instSvc, SilentAfter: o.SilentAfter,
		DeadAfter: o.PresumedDeadAfter, MaxHeartbeatsPerSecond: api.MaxHeartbeatsPerSecond, BootTimeout: o.BootTimeout, SwitchTimeout: o.SwitchTimeout}
	d.syncer = &provsync.Syncer{Store: st, Clock: o.Clock, Log: log, Instances: d.instSvc, StreamLostConfirm: 2 * time.Second}
	// Death signals (a provider's exit, a dropped stream) ask the provider
	// at once instead of waiting for the sync or the silence (design §2.7).
	d.checks = &provsync.Checks{Syncer: d.syncer}
	for _, p := range machines {
		if w, ok := p.(providers.ExitWatcher); ok {
			d.exitWatchers = append(d.exitWatchers, w)
		}
	}
	d.presence = &presence.Tracker{Store: st, Clock: o.Clock, Log: log, Lease: o.PresenceLease}
	d.pools = &pool.Service{Store: st, Clock: o.Clock, Log: log.With("component", "pool"), Instances: d.instSvc,
		StaleHeartbeatAfter: o.SilentAfter, MaxHeartbeatsPerSecond: api.MaxHeartbeatsPerSecond, Nudges: nudges}
	d.hub = api.NewAgentHub(st, log, o.HeartbeatFlush)
	d.hub.Sweep = o.AgentSweep
	d.enrollSvc = &enroll.Service{Store: st, CA: authority, Clock: o.Clock, Log: log}
	d.srv, err = api.New(api.Config{
		Store: st, CA: authority, CAs: d.cas, GetServerCert: d.cas.ServerCertificate(d.serverCert.GetCertificate), Clock: o.Clock, Log: log, Registerer: reg,
		Catalog: &catalog.Service{Store: st, Clock: o.Clock}, Certificates: &certificates.Service{Store: st, Clock: o.Clock},
		Enrollment: d.enrollSvc, EnrollLimiter: o.unauthenticatedLimiter(),
		Instances: d.instSvc, Tasks: d.taskSvc,
		Registry: &modules.Registry{Store: st, Blobs: blobs, Clock: o.Clock, Log: log, StaticSigners: edKeys(keys)},
		Revoked:  d.revoked, Agents: d.hub, AgentURL: o.AgentURL, SigningKeys: keys,
		ReadyHooks: []instances.ReadyHook{d.pools.ReadyHook}, Pools: d.pools, DisableAudit: o.DisableAudit, Credentials: d.creds, Panics: panics,
		Presence: d.presence, StreamLost: func(id string) { d.checks.Signal(id, provsync.SourceStreamLost) },
		Limits: api.Limits{MaxConnections: max(o.MaxAgentConnections, 0), MaxUnauthenticatedPerSource: max(o.MaxUnauthenticatedPerSource, 0),
			HandshakeTimeout: o.HandshakeTimeout, UnauthenticatedAge: o.UnauthenticatedAge},
	})
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	log.Info("connection budget", "max_agent_connections", o.MaxAgentConnections, "fd_reserve", o.FDReserve,
		"max_unauthenticated_per_source", o.MaxUnauthenticatedPerSource)
	d.hub.Metrics = d.srv.Metrics
	if d.netLis != nil {
		d.netboot = &netboot.Server{Store: st, Clock: o.Clock, Log: log.With("component", "netboot"), Instances: d.instSvc,
			Limiter: o.unauthenticatedLimiter(), RateLimited: d.srv.Metrics.RateLimited.WithLabelValues("netboot"), Panics: panics,
			ConnectionsRefused: netbootRefused(reg)}
		if o.PXE.Enabled() {
			d.netboot.Loaders = o.PXE.Loaders()
		}
	}
	if d.pxe, err = o.pxeService(st, log, panics); err != nil {
		return nil, err
	}

	if d.lis == nil {
		if d.lis, err = net.Listen("tcp", o.Listen); err != nil {
			return nil, fmt.Errorf("serve: listen on %s: %w", o.Listen, err)
		}
	}
	d.presence.Replica = o.replica(d.lis.Addr().String())
	if d.metricsLis == nil && o.MetricsListen != "" {
		if d.metricsLis, err = net.Listen("tcp", o.MetricsListen); err != nil {
			return nil, fmt.Errorf("serve: metrics listen on %s: %w", o.MetricsListen, err)
		}
	}
	if d.metricsLis != nil {
		d.metricsSrv, d.metricsLis = metricsServer(reg, d.metricsLis, *o, log)
	}
	return d, nil
}

// spawn runs f on the background context in a worker stop waits for.
func (d *daemon) spawn(bg context.Context, f func(context.Context)) {
	done := make(chan struct{})
	d.workers = append(d.workers, done)
	go func() { defer close(done); f(bg) }()
}

// run starts the workers and the servers, and serves until ctx ends (nil)
// or a server fails (its error). stop undoes it either way.
func (d *daemon) run(ctx context.Context) error {
	o, log, st := d.o, d.log, d.st
	bg, stopBG := context.WithCancel(context.Background())
	d.stopBG = stopBG
	// Before anything serves: this replica holds no stream yet, whatever
	// its previous run left behind, and rows whose machines died while we
	// were down move before a claim can read them (design §2.7, §2.10).
	if err := d.presence.Start(ctx, st.Backend() == "sqlite"); err != nil {
		stopBG()
		return err
	}
	d.startupSync(ctx)
	d.spawn(bg, d.hub.Run)
	d.spawn(bg, d.presence.Run)
	d.spawn(bg, d.checks.Run)
	for _, w := range d.exitWatchers {
		w.WatchExits(bg, d.checks.Exit)
	}
	d.spawn(bg, d.wk.Run)
	d.spawn(bg, func(ctx context.Context) {
		// Terminates a previous run left between intent and destroy.
		if n, err := d.instSvc.ResumeTerminates(ctx, 0); err != nil {
			log.Warn("resuming interrupted terminates", "finished", n, "err", err)
		} else if n > 0 {
			log.Info("finished terminates interrupted by the previous run", "count", n)
		}
	})
	failed := make(chan error, 3)
	if d.netboot != nil {
		d.spawn(bg, func(ctx context.Context) {
			if err := d.netboot.Serve(ctx, d.netLis); err != nil {
				failed <- fmt.Errorf("serve: netboot server: %w", err)
			}
		})
		d.spawn(bg, func(ctx context.Context) { flushRefusals(ctx, o.LoopEvery, d.netboot.FlushRefusals) })
		log.Info("netboot serving", "addr", d.netLis.Addr().String(), "url", o.NetbootURL)
	}
	d.spawn(bg, func(ctx context.Context) { flushRefusals(ctx, o.LoopEvery, d.enrollSvc.FlushRefusals) })
	if d.pxe != nil {
		d.spawn(bg, func(ctx context.Context) { runPXE(ctx, d.pxe, log) })
	}
	d.spawn(bg, func(ctx context.Context) {
		d.revoked.Follow(ctx, st, o.Clock, 30*time.Second, log, d.reloadFailures)
	})
	d.spawn(bg, func(ctx context.Context) { d.cas.Follow(ctx, 30*time.Second) })
	d.spawn(bg, func(ctx context.Context) {
		watchServerCert(ctx, d.serverCert, o.ReloadServerCert, o.ServerCertCheck, log)
	})
	// Replenishes asked for between reaper ticks: a claim, a release, a
	// member terminated or fenced, a refused acquire, a new or re-activated
	// pool. Every replica runs it: a replenish recounts under the pool's
	// row lock, so replicas never overshoot (docs/adr/0008).
	d.spawn(bg, d.pools.RunNudges)
	d.spawn(bg, func(ctx context.Context) { loops.Run(ctx, st.Elector(), log, d.loops()...) })
	if d.metricsSrv != nil {
		d.spawn(bg, func(context.Context) {
			if err := d.metricsSrv.Serve(d.metricsLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				failed <- fmt.Errorf("serve: metrics server: %w", err)
			}
		})
		log.Info("metrics listening", "addr", d.metricsLis.Addr().String())
	}
	d.spawn(bg, func(context.Context) {
		if err := d.srv.Serve(d.lis); err != nil {
			failed <- fmt.Errorf("serve: %w", err)
		}
	})
	log.Info("tetherd serving", "addr", d.lis.Addr().String(), "store", st.Backend(), "data_dir", o.DataDir,
		"agent_url", o.AgentURL, "ca_fingerprint", d.fingerprint, "providers", d.instSvc.ProviderNames(),
		"qemu_mode", o.QEMUMode, "kernel", d.kernel, "initramfs", d.initramfs)
	if o.Ready != nil {
		o.Ready <- d.lis.Addr().String()
	}
	select {
	case <-ctx.Done():
		log.Info("shutting down: draining calls")
		return nil
	case err := <-failed:
		log.Error("shutting down: a server failed", "err", err)
		return err
	}
}

// startupSync runs provider sync once before claims are served, bounded
// so that a provider that does not answer cannot keep tetherd from
// starting (the periodic loop retries it). Claims are safe meanwhile
// anyway: no member is present until its agent reconnects.
func (d *daemon) startupSync(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := d.syncer.Tick(sctx)
	if err != nil {
		d.log.Warn("provider sync at start-up failed; the periodic sync retries", "err", err)
	}
	if res.Errored > 0 || res.GuestsPresent > 0 {
		d.log.Warn("provider sync at start-up", "errored", res.Errored, "guests_present", res.GuestsPresent, "destroyed", res.Destroyed)
	}
}

// replica is this replica's name in agent presence: stable across
// restarts on one host and port, so a restart expires what it held.
func (o *ServeOptions) replica(listen string) string {
	if o.Replica != "" {
		return o.Replica
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "tetherd"
	}
	return host + "/" + listen
}

// loops are the periodic jobs, each run by one replica at a time.
func (d *daemon) loops() []loops.Loop {
	o, st := d.o, d.st
	return []loops.Loop{
		{Name: "task-leases", Every: o.LoopEvery, Tick: func(ctx context.Context) error {
			_, err := d.taskSvc.ExpireLeases(ctx)
			return err
		}},
		{Name: "terminate-reconciler", Every: o.LoopEvery, Tick: func(ctx context.Context) error {
			_, err := d.instSvc.ResumeTerminates(ctx, o.TerminateResumeAfter)
			return err
		}},
		{Name: "provision-sweeper", Every: o.LoopEvery, Tick: func(ctx context.Context) error {
			_, err := d.instSvc.SweepProvisions(ctx)
			return err
		}},
		{Name: "liveness", Every: o.LoopEvery, Tick: func(ctx context.Context) error {
			_, err := d.sensor.Tick(ctx)
			return err
		}},
		{Name: "provider-sync", Every: o.ProviderSyncEvery, Tick: func(ctx context.Context) error {
			_, err := d.syncer.Tick(ctx)
			return err
		}},
		{Name: "pool-reaper", Every: o.PoolReaperEvery, Tick: func(ctx context.Context) error {
			_, err := d.pools.Tick(ctx)
			return err
		}},
		{Name: "retention", Every: time.Hour, Tick: retention.New(st, o.Clock, d.log,
			retention.Policy{EventsLow: o.EventRetentionLow, EventsHigh: o.EventRetentionHigh}, retention.Batch).Tick},
	}
}

// stop stops accepting and ends the streams, stops the metrics server,
// cancels the workers and waits for every one of them, then closes the
// listeners and, last, the store.
func (d *daemon) stop() {
	d.srv.Stop(10 * time.Second)
	if d.metricsSrv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := d.metricsSrv.Shutdown(sctx); err != nil {
			d.log.Warn("metrics server shutdown", "err", err)
		}
		cancel()
	}
	if d.stopBG != nil {
		d.stopBG()
	}
	for _, w := range d.workers {
		<-w
	}
	d.close()
	d.log.Info("tetherd stopped")
}

// close closes the listeners and then the store; each may be unopened or
// already closed by the server that used it.
func (d *daemon) close() {
	for _, l := range []net.Listener{d.lis, d.netLis, d.metricsLis} {
		if l == nil {
			continue
		}
		if err := l.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			d.log.Warn("closing a listener", "addr", l.Addr().String(), "err", err)
		}
	}
	if d.st != nil {
		if err := d.st.Close(); err != nil {
			d.log.Error("closing the store", "err", err)
		}
	}
}

// unauthenticatedLimiter is a fresh per-source limiter for one
// unauthenticated route; nil when the limit is off.
func (o *ServeOptions) unauthenticatedLimiter() *throttle.Limiter {
	if o.UnauthenticatedRate < 0 {
		return nil
	}
	return throttle.NewLimiter(o.Clock, o.UnauthenticatedRate, o.UnauthenticatedBurst, 0)
}

// flushRefusals writes the coalesced refusal counts of windows that
// ended, every `every`, and all of them once more at shutdown (stop
// waits for it before the store closes). Each replica holds its own
// counts, so this runs on every replica.
func flushRefusals(ctx context.Context, every time.Duration, flush func(context.Context, bool)) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			flush(fctx, true)
			cancel()
			return
		case <-t.C:
			flush(ctx, false)
		}
	}
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
	if o.Listen == "" {
		o.Listen = "127.0.0.1:7443"
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
	if o.HeartbeatFlush <= 0 {
		o.HeartbeatFlush = time.Second
	}
	if o.LoopEvery <= 0 {
		o.LoopEvery = 5 * time.Second
	}
	if o.ProviderSyncEvery <= 0 {
		o.ProviderSyncEvery = time.Minute
	}
	if o.TerminateResumeAfter <= 0 {
		o.TerminateResumeAfter = time.Minute
	}
	if o.QEMUMode == "" {
		o.QEMUMode = string(qemu.ModeReal)
	}
	if o.PoolReaperEvery <= 0 {
		o.PoolReaperEvery = pool.DefaultReaperEvery
	}
	if o.UnauthenticatedRate == 0 {
		o.UnauthenticatedRate = 20
	}
	if o.UnauthenticatedBurst <= 0 {
		o.UnauthenticatedBurst = 200
	}
	if o.ServerCertCheck <= 0 {
		o.ServerCertCheck = 10 * time.Second
	}
	if o.EventRetentionLow <= 0 {
		o.EventRetentionLow = retention.DefaultEventsLow
	}
	if o.EventRetentionHigh <= 0 {
		o.EventRetentionHigh = retention.DefaultEventsHigh
	}
	if o.AgentURL == "" {
		addr := o.Listen
		if o.Listener != nil {
			addr = o.Listener.Addr().String()
		}
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			return fmt.Errorf("serve: --listen %q: %w", addr, err)
		}
		o.AgentURL = "https://10.0.2.2:" + port
	}
	return nil
}

// OpenStore opens the store a --store value names.
func OpenStore(ctx context.Context, spec, dataDir string, log *slog.Logger) (store.Store, error) {
	switch {
	case spec == "" || spec == "sqlite":
		path := filepath.Join(dataDir, SQLiteFile)
		if err := privateSQLite(dataDir, path); err != nil {
			return nil, fmt.Errorf("serve: %w", err)
		}
		s, err := sqlite.Open(ctx, path)
		if err != nil {
			return nil, fmt.Errorf("serve: %w", err)
		}
		return s, nil
	case strings.HasPrefix(spec, "postgres://"), strings.HasPrefix(spec, "postgresql://"):
		return openPostgres(ctx, spec, log)
	default:
		return nil, fmt.Errorf("serve: --store %q: want sqlite or a postgres:// URL", spec)
	}
}

func loadSigningKeys(files []string) ([][]byte, error) {
	var out [][]byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("module signing key: %w", err)
		}
		key, err := ParseSigningKey(b)
		if err != nil {
			return nil, fmt.Errorf("module signing key %s: %w", f, err)
		}
		out = append(out, key)
	}
	return out, nil
}

func edKeys(keys [][]byte) []ed25519.PublicKey {
	out := make([]ed25519.PublicKey, len(keys))
	for i, k := range keys {
		out[i] = k
	}
	return out
}

// ParseSigningKey accepts a raw 32-byte Ed25519 public key or a PEM/PKIX one.
func ParseSigningKey(b []byte) (ed25519.PublicKey, error) {
	if len(b) == ed25519.PublicKeySize {
		return ed25519.PublicKey(b), nil
	}
	pub, err := parsePKIXEd25519(b)
	if err != nil {
		return nil, err
	}
	return pub, nil
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
	if o.FDReserve <= 0 {
		o.FDReserve = DefaultFDReserve
	}
	if o.MaxUnauthenticatedPerSource == 0 {
		o.MaxUnauthenticatedPerSource = DefaultMaxUnauthenticatedPerSource
	}
	if o.MaxAgentConnections != 0 {
		return nil
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("serve: read the descriptor limit for --max-agent-connections: %w", err)
	}
	if lim.Cur > 1<<30 { // unlimited, in effect
		o.MaxAgentConnections = -1
		return nil
	}
	o.MaxAgentConnections = int(lim.Cur) - o.FDReserve
	if o.MaxAgentConnections < 1 {
		return fmt.Errorf("serve: the descriptor limit %d leaves no agent connections after --fd-reserve %d; raise the limit (ulimit -n) or lower the reserve", lim.Cur, o.FDReserve)
	}
	return nil
}

// watchServerCert keeps the server certificate in service current: a
// reload on demand (SIGHUP), and a stat of its files on every tick (a
// poll of files another process writes, on the wall clock on purpose).
// A pair that does not load leaves the old one serving, and says why.
func watchServerCert(ctx context.Context, r *certreload.Reloader, now <-chan struct{}, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		var err error
		select {
		case <-ctx.Done():
			return
		case <-now:
			_, err = r.Reload()
		case <-t.C:
			_, err = r.Check()
		}
		if err != nil {
			log.Error("the server certificate did not reload; the one loaded before stays in service", "err", err)
		}
	}
}
