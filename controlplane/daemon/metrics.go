package daemon

import (
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tetherfleet/tether/controlplane/connlimit"
)

// maxMetricsConns is the metrics port's share of the descriptor budget: a
// few scrapers and an operator's curl.
const maxMetricsConns = 16

// metricsServer serves /metrics and, with --pprof only, /debug/pprof, on
// lis bounded to maxMetricsConns connections idle at most 30 s (the
// listener to serve on is the bounded one it returns).
func metricsServer(reg *prometheus.Registry, lis net.Listener, o ServeOptions, log *slog.Logger) (*http.Server, net.Listener) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	if o.Listeners.Pprof {
		// Profiles answer "where did the CPU or memory go" on a live
		// control plane; a goroutine dump also shows what every call is
		// doing, so they are served only when asked for.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	if !isLoopback(lis.Addr()) {
		log.Warn("the metrics listener is reachable beyond this host and serves without authentication",
			"addr", lis.Addr().String(), "pprof", o.Listeners.Pprof)
	}
	bounded := connlimit.Wrap(lis, connlimit.Options{MaxConns: maxMetricsConns, Log: log, Clock: o.Clock})
	return &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 30 * time.Second}, bounded
}

func isLoopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// netbootRefused counts connections the netboot port's caps closed.
func netbootRefused(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_netboot_connections_refused_total",
		Help: "Connections the netboot HTTP port closed for its caps, by reason (max_connections, shed_unauthenticated_per_source)."},
		[]string{"reason"})
	reg.MustRegister(c)
	return c
}
