package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/tetherfleet/tether/controlplane/certreload"
	"github.com/tetherfleet/tether/controlplane/loops"
	"github.com/tetherfleet/tether/controlplane/retention"
)

// task is one thing a running tetherd does until it stops. A task that
// returns an error stops tetherd, and that error is what Serve returns.
type task struct {
	name string
	run  func(context.Context) error
}

// quiet is a task that reports no error: it logs its own, and a
// failure of it does not stop tetherd.
func quiet(name string, f func(context.Context)) task {
	return task{name, func(ctx context.Context) error { f(ctx); return nil }}
}

// run starts the background work and the servers, serves until ctx ends
// or a task fails, and returns only when every task has ended: nil when
// ctx ended, else the first task's error.
//
// The background work does not run on ctx. The servers stop first
// (streams end, calls drain) and only then the background work, so that
// what it writes at its end (the hub's last heartbeats, the refusal
// counts) comes after the last call and before close shuts the store.
func (d *daemon) run(ctx context.Context) error {
	o, log := d.o, d.log
	// Before anything serves: this replica holds no stream yet, whatever
	// its previous run left behind, and rows whose machines died while we
	// were down move before a claim can read them (design §2.7, §2.10).
	if err := d.svc.Presence.Start(ctx, d.st.Backend() == "sqlite"); err != nil {
		return err
	}
	d.startupSync(ctx)

	g, failed := errgroup.WithContext(ctx)
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBG()
	start := func(t task) {
		g.Go(func() error {
			err := t.run(bg)
			if err != nil {
				log.Error("a task failed", "task", t.name, "err", err)
			}
			return err
		})
	}
	for _, t := range d.background() {
		start(t)
	}
	for _, w := range d.exitWatchers {
		w.WatchExits(bg, d.svc.Checks.Exit)
	}
	for _, t := range d.servers() {
		start(t)
	}
	g.Go(func() error {
		<-failed.Done()
		if ctx.Err() != nil {
			log.Info("shutting down: draining calls")
		} else {
			log.Error("shutting down: a task failed")
		}
		d.stopServers()
		stopBG()
		return nil
	})

	if d.netboot != nil {
		log.Info("netboot serving", "addr", d.netLis.Addr().String(), "url", o.Listeners.NetbootURL)
	}
	if d.metricsSrv != nil {
		log.Info("metrics listening", "addr", d.metricsLis.Addr().String())
	}
	log.Info("tetherd serving", "addr", d.lis.Addr().String(), "store", d.st.Backend(), "data_dir", o.DataDir,
		"agent_url", o.Listeners.AgentURL, "ca_fingerprint", d.authority.Fingerprint(), "providers", d.svc.Instances.ProviderNames(),
		"qemu_mode", o.Providers.QEMU.Mode, "kernel", d.kernel, "initramfs", d.initramfs)
	if o.Test.Ready != nil {
		o.Test.Ready <- d.lis.Addr().String()
	}
	return g.Wait()
}

// background is the work every replica runs beside its servers; the
// periodic jobs among it run on one replica at a time (loops.Run).
func (d *daemon) background() []task {
	o, log, st := d.o, d.log, d.st
	ts := []task{
		quiet("agent-hub", d.hub.Run),
		quiet("presence", d.svc.Presence.Run),
		quiet("death-checks", d.svc.Checks.Run),
		quiet("worker", d.svc.Worker.Run),
		quiet("resume-terminates", func(ctx context.Context) {
			// Terminates a previous run left between intent and destroy.
			if n, err := d.svc.Instances.ResumeTerminates(ctx, 0); err != nil {
				log.Warn("resuming interrupted terminates", "finished", n, "err", err)
			} else if n > 0 {
				log.Info("finished terminates interrupted by the previous run", "count", n)
			}
		}),
		quiet("enroll-refusals", func(ctx context.Context) { flushRefusals(ctx, o.Loops.Every, d.svc.Enroll.FlushRefusals) }),
		quiet("revocations", func(ctx context.Context) {
			d.revoked.Follow(ctx, st, o.Clock, 30*time.Second, log, d.reloadFailures)
		}),
		quiet("ca-set", func(ctx context.Context) { d.cas.Follow(ctx, 30*time.Second) }),
		quiet("server-cert", func(ctx context.Context) {
			watchServerCert(ctx, d.serverCert, o.ReloadServerCert, o.Loops.ServerCertCheck, log)
		}),
		// Replenishes asked for between reaper ticks: a claim, a release, a
		// member terminated or fenced, a refused acquire, a new or
		// re-activated pool. Every replica runs it: a replenish recounts
		// under the pool's row lock, so replicas never overshoot
		// (docs/adr/0008).
		quiet("pool-nudges", d.svc.Pools.RunNudges),
		quiet("loops", func(ctx context.Context) { loops.Run(ctx, st.Elector(), log, d.loops()...) }),
	}
	if d.netboot != nil {
		ts = append(ts, quiet("netboot-refusals", func(ctx context.Context) { flushRefusals(ctx, o.Loops.Every, d.netboot.FlushRefusals) }))
	}
	if d.pxe != nil {
		// A DHCP or TFTP failure is logged, not fatal: the gRPC API and
		// machines already booted do not need it.
		ts = append(ts, quiet("pxe", func(ctx context.Context) { runPXE(ctx, d.pxe, log) }))
	}
	return ts
}

// servers are the listeners' servers. The gRPC and metrics servers end
// when stopServers stops them, the netboot server when its context ends
// (after stopServers); an error from any of them stops tetherd.
func (d *daemon) servers() []task {
	ts := []task{{"grpc", func(context.Context) error {
		// A stop that comes before Serve (tetherd told to stop as it
		// starts) makes Serve return ErrServerStopped: no failure.
		if err := d.srv.Serve(d.lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("serve: %w", err)
		}
		return nil
	}}}
	if d.netboot != nil {
		ts = append(ts, task{"netboot", func(ctx context.Context) error {
			if err := d.netboot.Serve(ctx, d.netLis); err != nil {
				return fmt.Errorf("serve: netboot server: %w", err)
			}
			return nil
		}})
	}
	if d.metricsSrv != nil {
		ts = append(ts, task{"metrics", func(context.Context) error {
			if err := d.metricsSrv.Serve(d.metricsLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve: metrics server: %w", err)
			}
			return nil
		}})
	}
	return ts
}

// stopServers stops accepting and ends the streams (in-flight calls get
// 10 s), then stops the metrics server.
func (d *daemon) stopServers() {
	d.srv.Stop(10 * time.Second)
	if d.metricsSrv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := d.metricsSrv.Shutdown(sctx); err != nil {
			d.log.Warn("metrics server shutdown", "err", err)
		}
		cancel()
	}
}

// startupSync runs provider sync once before claims are served, bounded
// so that a provider that does not answer cannot keep tetherd from
// starting (the periodic loop retries it). Claims are safe meanwhile
// anyway: no member is present until its agent reconnects.
func (d *daemon) startupSync(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := d.svc.Sync.Tick(sctx)
	if err != nil {
		d.log.Warn("provider sync at start-up failed; the periodic sync retries", "err", err)
	}
	if res.Errored > 0 || res.GuestsPresent > 0 {
		d.log.Warn("provider sync at start-up", "errored", res.Errored, "guests_present", res.GuestsPresent, "destroyed", res.Destroyed)
	}
}

// loops are the periodic jobs, each run by one replica at a time.
func (d *daemon) loops() []loops.Loop {
	o, st := d.o, d.st
	return []loops.Loop{
		{Name: "task-leases", Every: o.Loops.Every, Tick: func(ctx context.Context) error {
			_, err := d.svc.Tasks.ExpireLeases(ctx)
			return err
		}},
		{Name: "terminate-reconciler", Every: o.Loops.Every, Tick: func(ctx context.Context) error {
			_, err := d.svc.Instances.ResumeTerminates(ctx, o.Loops.TerminateResumeAfter)
			return err
		}},
		{Name: "provision-sweeper", Every: o.Loops.Every, Tick: func(ctx context.Context) error {
			_, err := d.svc.Instances.SweepProvisions(ctx)
			return err
		}},
		{Name: "liveness", Every: o.Loops.Every, Tick: func(ctx context.Context) error {
			_, err := d.svc.Liveness.Tick(ctx)
			return err
		}},
		{Name: "provider-sync", Every: o.Loops.ProviderSyncEvery, Tick: func(ctx context.Context) error {
			_, err := d.svc.Sync.Tick(ctx)
			return err
		}},
		{Name: "pool-reaper", Every: o.Loops.PoolReaperEvery, Tick: func(ctx context.Context) error {
			_, err := d.svc.Pools.Tick(ctx)
			return err
		}},
		{Name: "retention", Every: time.Hour, Tick: retention.New(st, o.Clock, d.log,
			o.Retention, retention.Batch).Tick},
	}
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
