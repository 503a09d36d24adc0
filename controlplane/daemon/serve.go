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
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tetherfleet/tether/controlplane/api"
	"github.com/tetherfleet/tether/controlplane/enroll"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/loops"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/controlplane/tasks"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/pki/ca"
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

	HeartbeatFlush time.Duration // default 1 s
	LoopEvery      time.Duration // default 5 s
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
	taskSvc := &tasks.Service{Store: st, Clock: o.Clock, Log: log}
	instSvc := &instances.Service{Store: st, Clock: o.Clock, Log: log, Providers: []string{instances.ProviderExternal}}
	hub := api.NewAgentHub(st, log, o.HeartbeatFlush)
	srv := api.New(api.Config{
		Store: st, CA: authority, ServerCert: serverCert, Clock: o.Clock, Log: log, Registerer: reg,
		Enrollment: &enroll.Service{Store: st, CA: authority, Clock: o.Clock, Log: log},
		Instances:  instSvc, Tasks: taskSvc,
		Registry:   &modules.Registry{Store: st, Blobs: blobs, Clock: o.Clock, Log: log},
		Revoked:    revoked, Agents: hub, AgentURL: o.AgentURL, SigningKeys: keys,
	})
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
	spawn(func(ctx context.Context) { revoked.Follow(ctx, st, o.Clock, 30*time.Second) })
	spawn(func(ctx context.Context) {
		loops.Run(ctx, st.Elector(), log,
			loops.Loop{Name: "task-leases", Every: o.LoopEvery, Tick: func(ctx context.Context) error {
				_, err := taskSvc.ExpireLeases(ctx)
				return err
			}},
			loops.Loop{Name: "event-retention", Every: time.Hour, Tick: func(ctx context.Context) error {
				now := o.Clock.Now()
				n, err := st.PruneEvents(ctx, now.Add(-o.EventRetentionLow), now.Add(-o.EventRetentionHigh))
				if n > 0 {
					log.Info("pruned fleet events past retention", "count", n)
				}
				return err
			}},
		)
	})
	var metricsSrv *http.Server
	if o.MetricsListen != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
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
		"agent_url", o.AgentURL, "ca_fingerprint", authority.Fingerprint())
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
	if o.Listen == "" {
		o.Listen = "127.0.0.1:7443"
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if o.HeartbeatFlush <= 0 {
		o.HeartbeatFlush = time.Second
	}
	if o.LoopEvery <= 0 {
		o.LoopEvery = 5 * time.Second
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
