package daemon

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/tetherfleet/tether/controlplane/agenthub"
	"github.com/tetherfleet/tether/controlplane/api"
	"github.com/tetherfleet/tether/controlplane/netboot"
	"github.com/tetherfleet/tether/controlplane/netboot/dhcp"
	"github.com/tetherfleet/tether/controlplane/provsync"
	"github.com/tetherfleet/tether/controlplane/revocation"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/throttle"
	"github.com/tetherfleet/tether/internal/guard"
)

// buildFronts builds what the listeners serve over the services: the
// gRPC API and the agent hub beside it, the netboot HTTP server, DHCP and
// TFTP, and the metrics server.
func (d *daemon) buildFronts(ctx context.Context) error {
	o, log, st, svc := &d.o, d.log, d.st, d.svc
	d.reg = prometheus.NewRegistry()
	d.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Every listener that serves untrusted input recovers its panics here.
	d.panics = guard.New(d.reg, log)
	d.revoked = revocation.NewSet()
	if err := d.revoked.Load(ctx, st, o.Clock.Now()); err != nil {
		return fmt.Errorf("serve: load revocations: %w", err)
	}
	d.reloadFailures = revocation.NewReloadFailures(d.reg)
	// The server and the hub count into the same instruments, made before
	// both.
	metrics := api.NewMetrics(d.reg)
	d.hub = agenthub.New(agenthub.Config{Store: st, Log: log, Flush: o.Liveness.HeartbeatFlush, Sweep: o.Liveness.AgentSweep, Metrics: metrics.Hub()})
	var err error
	d.srv, err = api.New(api.Config{
		Store: st, CA: d.authority, CAs: d.cas, GetServerCert: d.cas.ServerCertificate(d.serverCert.GetCertificate), Clock: o.Clock, Log: log, Metrics: metrics,
		Catalog: svc.Catalog, Certificates: svc.Certificates,
		Enrollment: svc.Enroll, EnrollLimiter: o.unauthenticatedLimiter(),
		Instances: svc.Instances, Tasks: svc.Tasks, Registry: svc.Registry,
		Revoked: d.revoked, Agents: d.hub, AgentURL: o.Listeners.AgentURL, SigningKeys: d.signingKeys,
		Ready: svc.Ready, Pools: svc.Pools, DisableAudit: o.Test.DisableAudit, Credentials: d.creds, Panics: d.panics,
		Presence: svc.Presence, StreamLost: func(id store.InstanceID) { svc.Checks.Signal(id, provsync.SourceStreamLost) },
		Limits: api.Limits{MaxConnections: max(o.Limits.MaxAgentConnections, 0), MaxUnauthenticatedPerSource: max(o.Limits.MaxUnauthenticatedPerSource, 0),
			HandshakeTimeout: o.Limits.HandshakeTimeout, UnauthenticatedAge: o.Limits.UnauthenticatedAge},
	})
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	log.Info("connection budget", "max_agent_connections", o.Limits.MaxAgentConnections, "fd_reserve", o.Limits.FDReserve,
		"max_unauthenticated_per_source", o.Limits.MaxUnauthenticatedPerSource)
	if d.netLis != nil {
		d.netboot = &netboot.Server{Store: st, Clock: o.Clock, Log: log.With("component", "netboot"), Instances: svc.Instances,
			Limiter: o.unauthenticatedLimiter(), RateLimited: metrics.RateLimited.WithLabelValues("netboot"), Panics: d.panics,
			ConnectionsRefused: netbootRefused(d.reg), Loaders: o.netbootLoaders(), UKIs: d.ukis,
			Announce: o.Listeners.NetbootAnnounce}
	}
	if len(d.ukis) > 0 && d.netboot == nil {
		return fmt.Errorf("serve: --uki needs --netboot-listen: the netboot server serves the images")
	}
	for _, img := range d.ukis {
		log.Info("unified kernel image", "template", img.Template, "digest", img.Digest, "signed", img.Signed, "cmdline", img.Cmdline)
		if !img.Signed {
			log.Warn("unified kernel image is not signed: Secure Boot firmware refuses it", "template", img.Template)
		}
	}
	var ukiChooser dhcp.UKIChooser
	if len(d.ukis) > 0 {
		ukiChooser = d.netboot
	}
	if d.pxe, err = o.pxeService(st, log, d.panics, ukiChooser); err != nil {
		return err
	}
	if d.metricsLis != nil {
		d.metricsSrv, d.metricsLis = metricsServer(d.reg, d.metricsLis, *o, log)
	}
	return nil
}

// unauthenticatedLimiter is a fresh per-source limiter for one
// unauthenticated route; nil when the limit is off.
func (o *ServeOptions) unauthenticatedLimiter() *throttle.Limiter {
	if o.Limits.UnauthenticatedRate < 0 {
		return nil
	}
	return throttle.NewLimiter(o.Clock, o.Limits.UnauthenticatedRate, o.Limits.UnauthenticatedBurst, 0)
}
