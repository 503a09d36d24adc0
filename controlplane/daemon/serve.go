package daemon

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/controlplane/agenthub"
	"github.com/tetherfleet/tether/controlplane/api"
	"github.com/tetherfleet/tether/controlplane/carotation"
	"github.com/tetherfleet/tether/controlplane/certreload"
	"github.com/tetherfleet/tether/controlplane/credentials"
	"github.com/tetherfleet/tether/controlplane/daemon/wire"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/netboot"
	"github.com/tetherfleet/tether/controlplane/netboot/pxe"
	"github.com/tetherfleet/tether/controlplane/revocation"
	"github.com/tetherfleet/tether/controlplane/store"
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
	// o is the one copy of the options: what build derives (the netboot
	// URL, say) is what run and the daemon's parts read afterwards.
	o   ServeOptions
	log *slog.Logger

	// What the data dir holds (openDataDir).
	st         store.Store
	authority  *ca.CA
	serverCert *certreload.Reloader
	sealer     *credentials.Sealer
	// cas is the CA rotation set every replica follows (design §3.10).
	cas         *carotation.Service
	blobs       *modules.Blobs
	signingKeys [][]byte
	// kernel and initramfs are the default artifacts' digests.
	kernel, initramfs string
	// ukis are the templates' signed images (--uki).
	ukis netboot.UKIs

	// Where it listens (openListeners).
	lis, netLis, metricsLis net.Listener

	// The machines and the services (buildMachines, buildServices).
	creds        *credentials.Service
	machines     map[string]providers.Provider
	exitWatchers []providers.ExitWatcher
	svc          *wire.Services

	// What the listeners serve (buildFronts).
	reg            *prometheus.Registry
	panics         *guard.Panics
	revoked        *revocation.Set
	reloadFailures prometheus.Counter
	hub            *agenthub.Hub
	srv            *api.Server
	netboot        *netboot.Server
	pxe            *pxe.Service
	metricsSrv     *http.Server
}

// build opens and builds everything, each step over what the steps
// before it made. On failure it closes what it opened.
func build(ctx context.Context, opts ServeOptions) (_ *daemon, err error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	// A test's listeners are the daemon's from the start: whatever step
	// fails, close closes them like those it opens itself.
	d := &daemon{o: opts, log: opts.Log, lis: opts.Test.Listener, netLis: opts.Test.NetbootListener, metricsLis: opts.Test.MetricsListener}
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	for _, step := range []func(context.Context) error{
		d.openDataDir,   // the CA, the server certificate, the store, blobs, keys, artifacts
		d.openListeners, // gRPC, netboot and metrics ports; the URLs machines reach them by
		d.buildMachines, // BMC credentials and the providers
		d.buildServices, // every service, once (wire.NewServices)
		d.buildFronts,   // metrics, the agent hub, the API, netboot, PXE and metrics servers
	} {
		if err := step(ctx); err != nil {
			return nil, err
		}
	}
	return d, nil
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
