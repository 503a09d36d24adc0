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
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/tetherfleet/tether/controlplane/api"
	"github.com/tetherfleet/tether/controlplane/audit"
	"github.com/tetherfleet/tether/controlplane/bmc"
	"github.com/tetherfleet/tether/controlplane/catalog"
	"github.com/tetherfleet/tether/controlplane/certificates"
	"github.com/tetherfleet/tether/controlplane/certreload"
	"github.com/tetherfleet/tether/controlplane/credentials"
	"github.com/tetherfleet/tether/controlplane/enroll"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/liveness"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/netboot"
	"github.com/tetherfleet/tether/controlplane/netboot/pxe"
	"github.com/tetherfleet/tether/controlplane/pool"
	"github.com/tetherfleet/tether/controlplane/presence"
	"github.com/tetherfleet/tether/controlplane/provsync"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/controlplane/tasks"
	"github.com/tetherfleet/tether/controlplane/throttle"
	"github.com/tetherfleet/tether/controlplane/worker"
	"github.com/tetherfleet/tether/internal/guard"
	"github.com/tetherfleet/tether/pki/ca"
	"github.com/tetherfleet/tether/providers"
)

// Serve runs the control plane until ctx ends or one of its tasks fails,
// in three phases: build opens everything (store, listeners, services)
// and fails before anything runs; run starts every task and, when ctx
// ends or the first task fails, stops them all (the servers drain first)
// and waits for them; close closes the listeners and, last, the store.
func Serve(ctx context.Context, o ServeOptions) error {
	d, err := build(ctx, o)
	if err != nil {
		return err
	}
	err = d.run(ctx)
	d.close()
	d.log.Info("tetherd stopped")
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
	creds          *credentials.Service
	reloadFailures prometheus.Counter

	fingerprint, kernel, initramfs string
}

// build opens and wires everything. On failure it closes what it opened.
func build(ctx context.Context, opts ServeOptions) (_ *daemon, err error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	d := &daemon{o: opts, log: opts.Log, lis: opts.Test.Listener, netLis: opts.Test.NetbootListener, metricsLis: opts.Test.MetricsListener}
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
	d.fingerprint = authority.Fingerprint()
	if d.serverCert, err = certreload.New(filepath.Join(o.DataDir, ServerCertFile), filepath.Join(o.DataDir, ServerKeyFile), o.Clock, log); err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	st, err := OpenStore(ctx, o.Store, o.DataDir, log)
	if err != nil {
		return nil, err
	}
	if o.Test.WrapStore != nil {
		st = o.Test.WrapStore(st)
	}
	// Every write of an audited admin call appends its audit record in
	// the same transaction (controlplane/audit).
	if !o.Test.DisableAudit {
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
	if d.netLis == nil && o.Listeners.Netboot != "" {
		if d.netLis, err = net.Listen("tcp", o.Listeners.Netboot); err != nil {
			return nil, fmt.Errorf("serve: netboot listen on %s: %w", o.Listeners.Netboot, err)
		}
	}
	if err := o.pxeURL(d.netLis); err != nil {
		return nil, err
	}
	if d.netLis != nil && o.Listeners.NetbootURL == "" {
		_, port, _ := net.SplitHostPort(d.netLis.Addr().String())
		o.Listeners.NetbootURL = "http://10.0.2.2:" + port
	}
	d.taskSvc = &tasks.Service{Store: st, Clock: o.Clock, Log: log}
	// The pool service replenishes on nudges the instance service sends:
	// the queue between them is made first, so neither is patched later.
	nudges := pool.NewNudges()
	d.instSvc = &instances.Service{Store: st, Clock: o.Clock, Log: log, Machines: machines, Pools: nudges,
		Artifacts: &instances.Artifacts{Blobs: blobs, Kernel: d.kernel, Initramfs: d.initramfs, BaseURL: strings.TrimSuffix(o.Listeners.NetbootURL, "/")},
		AgentURL:  o.Listeners.AgentURL, CAFingerprint: authority.Fingerprint(),
		Owner: worker.NewOwner("tetherd-api"), Lease: o.Loops.WorkerLease, SelfInstanceIDs: o.SelfInstanceIDs}
	d.wk = &worker.Worker{Store: st, Clock: o.Clock, Log: log.With("component", "worker"), Owner: worker.NewOwner("tetherd-worker"),
		Lease: o.Loops.WorkerLease, Poll: o.Loops.WorkerPoll, Handlers: d.instSvc.Handlers()}
	d.sensor = &liveness.Sensor{Store: st, Clock: o.Clock, Log: log, Instances: d.instSvc, SilentAfter: o.Liveness.SilentAfter,
		DeadAfter: o.Liveness.PresumedDeadAfter, MaxHeartbeatsPerSecond: api.MaxHeartbeatsPerSecond, BootTimeout: o.Liveness.BootTimeout, SwitchTimeout: o.Liveness.SwitchTimeout}
	d.syncer = &provsync.Syncer{Store: st, Clock: o.Clock, Log: log, Instances: d.instSvc, StreamLostConfirm: 2 * time.Second}
	// Death signals (a provider's exit, a dropped stream) ask the provider
	// at once instead of waiting for the sync or the silence (design §2.7).
	d.checks = &provsync.Checks{Syncer: d.syncer}
	for _, p := range machines {
		if w, ok := p.(providers.ExitWatcher); ok {
			d.exitWatchers = append(d.exitWatchers, w)
		}
	}
	// The replica's presence name is its gRPC address: that listener
	// opens before the tracker is built, so nothing is set on it later.
	if d.lis == nil {
		if d.lis, err = net.Listen("tcp", o.Listeners.GRPC); err != nil {
			return nil, fmt.Errorf("serve: listen on %s: %w", o.Listeners.GRPC, err)
		}
	}
	d.presence = &presence.Tracker{Store: st, Clock: o.Clock, Log: log, Lease: o.Liveness.PresenceLease, Replica: o.replica(d.lis.Addr().String())}
	d.pools = &pool.Service{Store: st, Clock: o.Clock, Log: log.With("component", "pool"), Instances: d.instSvc,
		StaleHeartbeatAfter: o.Liveness.SilentAfter, MaxHeartbeatsPerSecond: api.MaxHeartbeatsPerSecond, Nudges: nudges}
	// The server and the hub count into the same instruments, made before
	// both.
	metrics := api.NewMetrics(reg)
	d.hub = api.NewAgentHub(api.AgentHubConfig{Store: st, Log: log, Flush: o.Liveness.HeartbeatFlush, Sweep: o.Liveness.AgentSweep, Metrics: metrics})
	d.enrollSvc = &enroll.Service{Store: st, CA: authority, Clock: o.Clock, Log: log}
	d.srv, err = api.New(api.Config{
		Store: st, CA: authority, GetServerCert: d.serverCert.GetCertificate, Clock: o.Clock, Log: log, Metrics: metrics,
		Catalog: &catalog.Service{Store: st, Clock: o.Clock}, Certificates: &certificates.Service{Store: st, Clock: o.Clock},
		Enrollment: d.enrollSvc, EnrollLimiter: o.unauthenticatedLimiter(),
		Instances: d.instSvc, Tasks: d.taskSvc,
		Registry: &modules.Registry{Store: st, Blobs: blobs, Clock: o.Clock, Log: log, StaticSigners: edKeys(keys)},
		Revoked:  d.revoked, Agents: d.hub, AgentURL: o.Listeners.AgentURL, SigningKeys: keys,
		ReadyHooks: []instances.ReadyHook{d.pools.ReadyHook}, Pools: d.pools, DisableAudit: o.Test.DisableAudit, Credentials: d.creds, Panics: panics,
		Presence: d.presence, StreamLost: func(id string) { d.checks.Signal(id, provsync.SourceStreamLost) },
		Limits: api.Limits{MaxConnections: max(o.Limits.MaxAgentConnections, 0), MaxUnauthenticatedPerSource: max(o.Limits.MaxUnauthenticatedPerSource, 0),
			HandshakeTimeout: o.Limits.HandshakeTimeout, UnauthenticatedAge: o.Limits.UnauthenticatedAge},
	})
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	log.Info("connection budget", "max_agent_connections", o.Limits.MaxAgentConnections, "fd_reserve", o.Limits.FDReserve,
		"max_unauthenticated_per_source", o.Limits.MaxUnauthenticatedPerSource)
	if d.netLis != nil {
		d.netboot = &netboot.Server{Store: st, Clock: o.Clock, Log: log.With("component", "netboot"), Instances: d.instSvc,
			Limiter: o.unauthenticatedLimiter(), RateLimited: metrics.RateLimited.WithLabelValues("netboot"), Panics: panics,
			ConnectionsRefused: netbootRefused(reg), Loaders: o.netbootLoaders()}
	}
	if d.pxe, err = o.pxeService(st, log, panics); err != nil {
		return nil, err
	}

	if d.metricsLis == nil && o.Listeners.Metrics != "" {
		if d.metricsLis, err = net.Listen("tcp", o.Listeners.Metrics); err != nil {
			return nil, fmt.Errorf("serve: metrics listen on %s: %w", o.Listeners.Metrics, err)
		}
	}
	if d.metricsLis != nil {
		d.metricsSrv, d.metricsLis = metricsServer(reg, d.metricsLis, *o, log)
	}
	return d, nil
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
	if o.Limits.UnauthenticatedRate < 0 {
		return nil
	}
	return throttle.NewLimiter(o.Clock, o.Limits.UnauthenticatedRate, o.Limits.UnauthenticatedBurst, 0)
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
