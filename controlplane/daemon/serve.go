package daemon

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tetherfleet/tether/controlplane/api"
	"github.com/tetherfleet/tether/controlplane/enroll"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/liveness"
	"github.com/tetherfleet/tether/controlplane/loops"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/netboot"
	"github.com/tetherfleet/tether/controlplane/pool"
	"github.com/tetherfleet/tether/controlplane/provsync"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/controlplane/tasks"
	"github.com/tetherfleet/tether/controlplane/worker"
	"github.com/tetherfleet/tether/internal/clock"
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
	// Kernel and Initramfs are the default netboot artifacts, ingested into
	// the blob store at start-up (templates may name others by digest).
	Kernel, Initramfs string
	// NetbootListen serves the artifacts and per-instance iPXE scripts
	// over HTTP ("" = off); NetbootListener is used instead when set.
	NetbootListen   string
	NetbootListener net.Listener
	// NetbootURL is the netboot server as machines reach it; default
	// http://10.0.2.2:<port>, like AgentURL.
	NetbootURL string
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
	// AgentSweep is how often one query looks for agent work whose
	// notification was lost (default api.DefaultSweep).
	AgentSweep time.Duration
	LoopEvery  time.Duration // default 5 s
	// SilentAfter and PresumedDeadAfter are the liveness thresholds for a
	// small fleet (defaults 3 and 10 minutes); both stretch with its size.
	SilentAfter, PresumedDeadAfter time.Duration
	// BootTimeout errors a boot that makes no progress (default 15 min).
	BootTimeout time.Duration
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
	// EventRetention: low/medium and high/critical windows (defaults 90 and 365 days).
	EventRetentionLow, EventRetentionHigh time.Duration

	Clock clock.Clock
	Log   *slog.Logger
	// Ready, if set, receives the listening address once serving.
	Ready chan<- string
}

// Serve runs the control plane until ctx ends, then drains.
func Serve(ctx context.Context, o ServeOptions) error {
	if err := o.defaults(); err != nil {
		return err
	}
	log := o.Log
	authority, err := ca.Load(filepath.Join(o.DataDir, CADir), o.Clock)
	if err != nil {
		return fmt.Errorf("serve: %w (run `tetherd init --data-dir %s` first)", err, o.DataDir)
	}
	serverCert, err := tls.LoadX509KeyPair(filepath.Join(o.DataDir, ServerCertFile), filepath.Join(o.DataDir, ServerKeyFile))
	if err != nil {
		return fmt.Errorf("serve: server certificate: %w", err)
	}
	st, err := OpenStore(ctx, o.Store, o.DataDir, log)
	if err != nil {
		return err
	}
	defer st.Close()
	blobs, err := modules.OpenBlobs(filepath.Join(o.DataDir, BlobDir))
	if err != nil {
		return err
	}
	if n, err := blobs.SweepTmp(time.Hour, o.Clock.Now()); err == nil && n > 0 {
		log.Info("removed uploads left by an interrupted push", "count", n)
	}
	keys, err := loadSigningKeys(o.SigningKeyFiles)
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	revoked := api.NewRevocations()
	if err := revoked.Load(ctx, st, o.Clock.Now()); err != nil {
		return fmt.Errorf("serve: load revocations: %w", err)
	}
	machines, err := buildProviders(o, log, o.Clock)
	if err != nil {
		return err
	}
	kernel, err := ingestArtifact(blobs, "--kernel", o.Kernel)
	if err != nil {
		return err
	}
	initramfs, err := ingestArtifact(blobs, "--initramfs", o.Initramfs)
	if err != nil {
		return err
	}
	netLis := o.NetbootListener
	if netLis == nil && o.NetbootListen != "" {
		if netLis, err = net.Listen("tcp", o.NetbootListen); err != nil {
			return fmt.Errorf("serve: netboot listen on %s: %w", o.NetbootListen, err)
		}
	}
	if netLis != nil {
		defer netLis.Close()
		if o.NetbootURL == "" {
			_, port, _ := net.SplitHostPort(netLis.Addr().String())
			o.NetbootURL = "http://10.0.2.2:" + port
		}
	}
	taskSvc := &tasks.Service{Store: st, Clock: o.Clock, Log: log}
	instSvc := &instances.Service{Store: st, Clock: o.Clock, Log: log, Machines: machines,
		Artifacts: &instances.Artifacts{Blobs: blobs, Kernel: kernel, Initramfs: initramfs, BaseURL: strings.TrimSuffix(o.NetbootURL, "/")},
		AgentURL:  o.AgentURL, CAFingerprint: authority.Fingerprint(),
		Owner: worker.NewOwner("tetherd-api"), Lease: o.WorkerLease, SelfInstanceIDs: o.SelfInstanceIDs}
	wk := &worker.Worker{Store: st, Clock: o.Clock, Log: log.With("component", "worker"), Owner: worker.NewOwner("tetherd-worker"),
		Lease: o.WorkerLease, Poll: o.WorkerPoll, Handlers: instSvc.Handlers()}
	sensor := &liveness.Sensor{Store: st, Clock: o.Clock, Log: log, Instances: instSvc, SilentAfter: o.SilentAfter,
		DeadAfter: o.PresumedDeadAfter, MaxHeartbeatsPerSecond: api.MaxHeartbeatsPerSecond, BootTimeout: o.BootTimeout}
	syncer := &provsync.Syncer{Store: st, Clock: o.Clock, Log: log, Instances: instSvc}
	pools := &pool.Service{Store: st, Clock: o.Clock, Log: log.With("component", "pool"), Instances: instSvc,
		StaleHeartbeatAfter: o.SilentAfter, MaxHeartbeatsPerSecond: api.MaxHeartbeatsPerSecond}
	hub := api.NewAgentHub(st, log, o.HeartbeatFlush)
	hub.Sweep = o.AgentSweep
	srv := api.New(api.Config{
		Store: st, CA: authority, ServerCert: serverCert, Clock: o.Clock, Log: log, Registerer: reg,
		Enrollment: &enroll.Service{Store: st, CA: authority, Clock: o.Clock, Log: log},
		Instances:  instSvc, Tasks: taskSvc,
		Registry: &modules.Registry{Store: st, Blobs: blobs, Clock: o.Clock, Log: log},
		Revoked:  revoked, Agents: hub, AgentURL: o.AgentURL, SigningKeys: keys,
		ReadyHooks: []instances.ReadyHook{pools.ReadyHook}, Pools: pools,
		Limits: api.Limits{MaxConnections: max(o.MaxAgentConnections, 0), MaxUnauthenticatedPerSource: max(o.MaxUnauthenticatedPerSource, 0),
			HandshakeTimeout: o.HandshakeTimeout},
	})
	log.Info("connection budget", "max_agent_connections", o.MaxAgentConnections, "fd_reserve", o.FDReserve,
		"max_unauthenticated_per_source", o.MaxUnauthenticatedPerSource)
	hub.Metrics = srv.Metrics

	lis := o.Listener
	if lis == nil {
		if lis, err = net.Listen("tcp", o.Listen); err != nil {
			return fmt.Errorf("serve: listen on %s: %w", o.Listen, err)
		}
	}
	bg, stopBG := context.WithCancel(context.Background())
	defer stopBG()
	var workers []func()
	spawn := func(f func(context.Context)) {
		done := make(chan struct{})
		go func() { defer close(done); f(bg) }()
		workers = append(workers, func() { <-done })
	}
	spawn(hub.Run)
	spawn(wk.Run)
	spawn(func(ctx context.Context) {
		// Terminates a previous run left between intent and destroy.
		if n, err := instSvc.ResumeTerminates(ctx, 0); err != nil {
			log.Warn("resuming interrupted terminates", "finished", n, "err", err)
		} else if n > 0 {
			log.Info("finished terminates interrupted by the previous run", "count", n)
		}
	})
	if netLis != nil {
		nb := &netboot.Server{Store: st, Clock: o.Clock, Log: log.With("component", "netboot"), Instances: instSvc}
		spawn(func(ctx context.Context) {
			if err := nb.Serve(ctx, netLis); err != nil {
				log.Error("netboot server stopped", "err", err)
			}
		})
		log.Info("netboot serving", "addr", netLis.Addr().String(), "url", o.NetbootURL)
	}
	spawn(func(ctx context.Context) { revoked.Follow(ctx, st, o.Clock, 30*time.Second) })
	// Replenishes asked for between reaper ticks (a refused acquire, a new
	// or re-activated pool). Every replica runs it: a replenish recounts
	// under the pool's row lock, so replicas never overshoot.
	spawn(pools.RunNudges)
	spawn(func(ctx context.Context) {
		loops.Run(ctx, st.Elector(), log,
			loops.Loop{Name: "task-leases", Every: o.LoopEvery, Tick: func(ctx context.Context) error {
				_, err := taskSvc.ExpireLeases(ctx)
				return err
			}},
			loops.Loop{Name: "terminate-reconciler", Every: o.LoopEvery, Tick: func(ctx context.Context) error {
				_, err := instSvc.ResumeTerminates(ctx, o.TerminateResumeAfter)
				return err
			}},
			loops.Loop{Name: "provision-sweeper", Every: o.LoopEvery, Tick: func(ctx context.Context) error {
				_, err := instSvc.SweepProvisions(ctx)
				return err
			}},
			loops.Loop{Name: "liveness", Every: o.LoopEvery, Tick: func(ctx context.Context) error {
				_, err := sensor.Tick(ctx)
				return err
			}},
			loops.Loop{Name: "provider-sync", Every: o.ProviderSyncEvery, Tick: func(ctx context.Context) error {
				_, err := syncer.Tick(ctx)
				return err
			}},
			loops.Loop{Name: "pool-reaper", Every: o.PoolReaperEvery, Tick: func(ctx context.Context) error {
				_, err := pools.Tick(ctx)
				return err
			}},
			loops.Loop{Name: "retention", Every: time.Hour, Tick: func(ctx context.Context) error {
				return prune(ctx, st, log, o)
			}},
		)
	})
	var metricsSrv *http.Server
	if o.MetricsListen != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		// Profiles answer "where did the CPU or memory go" on a live
		// control plane; they ride on the metrics listener, which is off
		// unless asked for.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		metricsSrv = &http.Server{Addr: o.MetricsListen, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		ml, err := net.Listen("tcp", o.MetricsListen)
		if err != nil {
			return fmt.Errorf("serve: metrics listen on %s: %w", o.MetricsListen, err)
		}
		go func() { _ = metricsSrv.Serve(ml) }()
		log.Info("metrics listening", "addr", ml.Addr().String())
	}

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(lis) }()
	log.Info("tetherd serving", "addr", lis.Addr().String(), "store", st.Backend(), "data_dir", o.DataDir,
		"agent_url", o.AgentURL, "ca_fingerprint", authority.Fingerprint(), "providers", instSvc.ProviderNames(),
		"qemu_mode", o.QEMUMode, "kernel", kernel, "initramfs", initramfs)
	if o.Ready != nil {
		o.Ready <- lis.Addr().String()
	}
	select {
	case <-ctx.Done():
		log.Info("shutting down: draining calls")
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	}
	srv.Stop(10 * time.Second)
	if metricsSrv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = metricsSrv.Shutdown(sctx)
		cancel()
	}
	stopBG()
	for _, w := range workers {
		w()
	}
	log.Info("tetherd stopped")
	return nil
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
	if o.EventRetentionLow <= 0 {
		o.EventRetentionLow = 90 * 24 * time.Hour
	}
	if o.EventRetentionHigh <= 0 {
		o.EventRetentionHigh = 365 * 24 * time.Hour
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

// Record retention (docs/design.md §0.6: nothing accumulates forever). Events keep
// their own, configurable windows; the rest is history nothing reads.
const (
	taskRetention  = 30 * 24 * time.Hour // finished tasks: results stay readable for a month
	tokenRetention = 7 * 24 * time.Hour  // after expiry; a spent token is refused anyway once expired
	certRetention  = 30 * 24 * time.Hour // after expiry; revocation checks only need unexpired ones
)

// prune is one retention tick.
func prune(ctx context.Context, st store.Store, log *slog.Logger, o ServeOptions) error {
	now := o.Clock.Now()
	n, err := st.PruneEvents(ctx, now.Add(-o.EventRetentionLow), now.Add(-o.EventRetentionHigh))
	if err != nil {
		return err
	}
	p, err := st.PruneRecords(ctx, now.Add(-taskRetention), now.Add(-tokenRetention), now.Add(-certRetention))
	if err != nil {
		return err
	}
	if n+p.Tasks+p.Tokens+p.Certificates > 0 {
		log.Info("pruned records past retention", "events", n, "tasks", p.Tasks, "tokens", p.Tokens, "certificates", p.Certificates)
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
