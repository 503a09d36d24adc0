package api

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/fail"
)

// Metrics are the server's Prometheus instruments.
type Metrics struct {
	RPCs            *prometheus.CounterVec
	RPCLatency      *prometheus.HistogramVec
	ConnectedAgents prometheus.Gauge
	Heartbeats      prometheus.Counter
	HeartbeatWrites prometheus.Histogram
	TasksPushed     prometheus.Counter
	Enrollments     *prometheus.CounterVec
	// ConnectionsRefused counts connections closed at accept time, by
	// reason (connlimit's reasons); HandshakeFailures counts TLS
	// handshakes that failed or ran past their deadline.
	ConnectionsRefused *prometheus.CounterVec
	OpenConnections    prometheus.Gauge
	HandshakeFailures  prometheus.Counter
}

// NewMetrics registers the instruments with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		RPCs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_rpcs_total", Help: "RPCs handled, by method and code."},
			[]string{"method", "code"}),
		RPCLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tether_rpc_duration_seconds", Help: "Unary RPC latency.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}, []string{"method"}),
		ConnectedAgents: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tether_connected_agents", Help: "Agents with an open Connect stream on this replica."}),
		Heartbeats:      prometheus.NewCounter(prometheus.CounterOpts{Name: "tether_heartbeats_total", Help: "Heartbeats received."}),
		HeartbeatWrites: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tether_heartbeat_batch_size", Help: "Heartbeats written per batch.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 10)}),
		TasksPushed: prometheus.NewCounter(prometheus.CounterOpts{Name: "tether_tasks_pushed_total", Help: "Agent tasks pushed over Connect streams."}),
		Enrollments: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_enrollments_total", Help: "Enrollments by result."}, []string{"result"}),
		ConnectionsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_connections_refused_total",
			Help: "Connections closed at accept time, by reason: max_connections or unauthenticated_per_source."}, []string{"reason"}),
		OpenConnections: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tether_open_connections", Help: "Connections open on the gRPC port."}),
		HandshakeFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "tether_tls_handshake_failures_total",
			Help: "TLS handshakes on the gRPC port that failed or ran past the handshake deadline."}),
	}
	if reg != nil {
		reg.MustRegister(m.RPCs, m.RPCLatency, m.ConnectedAgents, m.Heartbeats, m.HeartbeatWrites, m.TasksPushed, m.Enrollments,
			m.ConnectionsRefused, m.OpenConnections, m.HandshakeFailures)
	}
	return m
}

// observe is the innermost interceptor: it maps every error onto the code
// table (never Unknown), counts and times the call, and logs failures.
func observe(m *Metrics, log *slog.Logger) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := next(ctx, req)
		err = fail.From(err)
		code := status.Code(err)
		m.RPCs.WithLabelValues(info.FullMethod, code.String()).Inc()
		m.RPCLatency.WithLabelValues(info.FullMethod).Observe(time.Since(start).Seconds())
		if err != nil {
			log.Debug("rpc failed", "method", info.FullMethod, "code", code.String(), "err", status.Convert(err).Message())
		}
		return resp, err
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, next grpc.StreamHandler) error {
		err := fail.From(next(srv, ss))
		code := status.Code(err)
		m.RPCs.WithLabelValues(info.FullMethod, code.String()).Inc()
		if err != nil && ss.Context().Err() == nil {
			log.Debug("stream failed", "method", info.FullMethod, "code", code.String(), "err", status.Convert(err).Message())
		}
		return err
	}
	return unary, stream
}

// mapAuthErrors makes sure errors from the outer interceptors (auth,
// strict input) are mapped too.
func mapUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	resp, err := next(ctx, req)
	return resp, fail.From(err)
}

func mapStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, next grpc.StreamHandler) error {
	return fail.From(next(srv, ss))
}
