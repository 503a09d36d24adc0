package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/internal/guard"
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
	// RateLimited counts unauthenticated requests refused for their
	// source's rate, by route (enroll, netboot).
	RateLimited *prometheus.CounterVec
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
			Help: "Connections closed by the gRPC port's limits, by reason: refused at accept (max_connections, unauthenticated_per_source), " +
				"an older unauthenticated one shed to admit a new one (shed_max_connections, shed_unauthenticated_per_source), " +
				"or a certificate-less one at its age limit (unauthenticated_age)."}, []string{"reason"}),
		OpenConnections: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tether_open_connections", Help: "Connections open on the gRPC port."}),
		HandshakeFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "tether_tls_handshake_failures_total",
			Help: "TLS handshakes on the gRPC port that failed or ran past the handshake deadline."}),
		RateLimited: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_rate_limited_total",
			Help: "Unauthenticated requests refused because their source passed its rate limit, by route."}, []string{"route"}),
	}
	if reg != nil {
		reg.MustRegister(m.RPCs, m.RPCLatency, m.ConnectedAgents, m.Heartbeats, m.HeartbeatWrites, m.TasksPushed, m.Enrollments,
			m.ConnectionsRefused, m.OpenConnections, m.HandshakeFailures, m.RateLimited)
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

// mapErrors is the outermost interceptor: every error, from the
// handlers and from the interceptors inside it (auth, strict input),
// leaves on the code table, and an internal one leaves without its text.
//
// It also recovers a panic in a handler: gRPC does not, and one call's
// bug would otherwise end every connection (issue 26). The panic is
// logged with its stack and counted, and the call answers Internal.
func mapErrors(log *slog.Logger, panics *guard.Panics) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	recovered := func(method string, v any) error {
		return hideInternal(log, method, fail.Internal("%v", panics.Note("grpc", v)))
	}
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if v := recover(); v != nil {
				resp, err = nil, recovered(info.FullMethod, v)
			}
		}()
		resp, err = next(ctx, req)
		return resp, hideInternal(log, info.FullMethod, fail.From(err))
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, next grpc.StreamHandler) (err error) {
		defer func() {
			if v := recover(); v != nil {
				err = recovered(info.FullMethod, v)
			}
		}()
		return hideInternal(log, info.FullMethod, fail.From(next(srv, ss)))
	}
	return unary, stream
}

// hideInternal logs an Internal error at Error under a fresh random id
// and answers the client with the id alone: the text of a bug (a path in
// the data dir, a SQL statement, a driver message) is for the operator's
// log, not for whoever made the call. The id ties the two together.
func hideInternal(log *slog.Logger, method string, err error) error {
	if status.Code(err) != codes.Internal {
		return err
	}
	id := errorID()
	log.Error("internal error", "id", id, "method", method, "err", status.Convert(err).Message())
	return status.Errorf(codes.Internal, "internal error (id %s); the server log has the details under this id", id)
}

func errorID() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		// crypto/rand does not fail on the platforms Go supports; a
		// constant id still hides the text.
		return "unavailable"
	}
	return hex.EncodeToString(b[:])
}
