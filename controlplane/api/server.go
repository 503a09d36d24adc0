// Package api is the gRPC surface of tetherd: the enrollment, agent and
// admin services, and the interceptors every call passes (authentication
// and authorisation, strict input, metrics, error mapping).
package api

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/reflection"

	"github.com/tetherfleet/tether/controlplane/agenthub"
	"github.com/tetherfleet/tether/controlplane/carotation"
	"github.com/tetherfleet/tether/controlplane/catalog"
	"github.com/tetherfleet/tether/controlplane/certificates"
	"github.com/tetherfleet/tether/controlplane/connlimit"
	bmccreds "github.com/tetherfleet/tether/controlplane/credentials"
	"github.com/tetherfleet/tether/controlplane/enroll"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/pool"
	"github.com/tetherfleet/tether/controlplane/presence"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/tasks"
	"github.com/tetherfleet/tether/controlplane/throttle"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/guard"
	"github.com/tetherfleet/tether/internal/modulewire"
	"github.com/tetherfleet/tether/pki/ca"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// MaxRecvMsgSize bounds every request message. Module pushes stream in
// chunks well below it; anything larger is refused by gRPC with
// ResourceExhausted before it is parsed.
const MaxRecvMsgSize = 4 << 20

// staticWindow is each connection's and each stream's fixed HTTP/2
// receive window (see New).
const staticWindow = 1 << 20

// Config wires the server.
type Config struct {
	Store      store.Store
	CA         *ca.CA
	ServerCert tls.Certificate
	// GetServerCert, when set, serves the certificate in place of
	// ServerCert, so that a renewed one is picked up without a restart.
	GetServerCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	Clock         clock.Clock
	Log           *slog.Logger
	// Metrics are the instruments every call is counted in (NewMetrics,
	// registered by the caller); the agent hub is built with the same ones.
	Metrics *Metrics

	Enrollment *enroll.Service
	// CAs is the CA rotation set (nil: the CA RPCs refuse, and no trust
	// bundle is sent).
	CAs       *carotation.Service
	Instances *instances.Service
	Tasks     *tasks.Service
	Registry  *modules.Registry
	Revoked   *Revocations
	Agents    *agenthub.Hub

	// AgentURL is the control plane address handed to agents.
	AgentURL string
	// SigningKeys are the Ed25519 keys module signatures may verify with.
	SigningKeys [][]byte
	// Ready records an agent's first ready report, with what else a ready
	// agent changes (pool membership): the composition root decides what
	// (wire.Services.Ready), so no pool type passes through the API.
	Ready Readiness
	// Pools serves the pool RPCs.
	Pools *pool.Service
	// Limits bound the connections the gRPC port holds.
	Limits Limits
	// EnrollLimiter rate-limits Enroll per source address (nil: no
	// limit). Enroll needs no credential, and each refusal costs a
	// database read.
	EnrollLimiter *throttle.Limiter
	// AttestTimeout bounds an attested enrollment (zero: AttestTimeout).
	AttestTimeout time.Duration
	// Catalog writes templates and nodes; Certificates writes revocations
	// (both required).
	Catalog      *catalog.Service
	Certificates *certificates.Service
	// Credentials stores BMC credentials (nil: the credential RPCs refuse).
	Credentials *bmccreds.Service
	// DisableAudit turns the audit trail off (only to measure its cost).
	DisableAudit bool
	// Panics records panics recovered in handlers (nil: recovered, not
	// counted).
	Panics *guard.Panics
	// Presence records which replica holds each agent's stream (nil: none
	// is recorded, and no pool member is claimable; tests of other paths).
	Presence *presence.Tracker
	// StreamLost, if set, is told an instance whose stream ended other
	// than by a newer stream replacing it: tetherd asks the provider for
	// the machine at once (provsync.Checks). It must not block.
	StreamLost func(instanceID store.InstanceID)
}

// Readiness records an agent's ready report (instances.Readiness).
type Readiness interface {
	AgentReady(ctx context.Context, instanceID store.InstanceID) error
	AgentReadyAsSeen(ctx context.Context, seen *store.Instance) error
}

// trustBundle is what agents are sent: nil without a rotation set.
func (c *Config) trustBundle() *v1.TrustBundle {
	if c.CAs == nil {
		return nil
	}
	return c.CAs.Bundle()
}

// Limits keep the gRPC port from spending the descriptors the store,
// listeners and providers need. Zero caps mean no cap.
type Limits struct {
	// MaxConnections caps the connections open at once.
	MaxConnections int
	// MaxUnauthenticatedPerSource caps, per source address, connections
	// that have not finished their TLS handshake.
	MaxUnauthenticatedPerSource int
	// HandshakeTimeout ends a connection whose TLS and HTTP/2 handshakes
	// take longer (zero: DefaultHandshakeTimeout).
	HandshakeTimeout time.Duration
	// UnauthenticatedAge closes a connection without a CA-signed client
	// certificate this long after its accept (zero:
	// DefaultUnauthenticatedAge; negative: never).
	UnauthenticatedAge time.Duration
}

// DefaultUnauthenticatedAge bounds a certificate-less connection: it is
// for one Enroll (or a health check), which takes milliseconds. Keep-alive
// pings do not extend it (docs/adr/0016).
const DefaultUnauthenticatedAge = 30 * time.Second

// DefaultHandshakeTimeout replaces gRPC's 120 s: an agent on a slow link
// completes a handshake in well under a second, and every connection
// still handshaking holds a descriptor anyone who reaches the port can spend.
const DefaultHandshakeTimeout = 5 * time.Second

// Server is a configured gRPC server.
type Server struct {
	GRPC    *grpc.Server
	Health  *health.Server
	Metrics *Metrics
	cfg     Config
	// streams ends every long-lived stream (agent Connect, event watches,
	// console follows) at shutdown: they never finish on their own, and a
	// graceful stop would otherwise wait them out.
	streams    context.Context
	endStreams context.CancelFunc
}

// New builds the server and registers every service. The services it
// delegates to are the caller's to build (the composition root does), so
// a missing one is an error, not one quietly made here.
func New(cfg Config) (*Server, error) {
	for _, r := range []struct {
		name    string
		missing bool
	}{{"Store", cfg.Store == nil}, {"CA", cfg.CA == nil}, {"Catalog", cfg.Catalog == nil},
		{"Certificates", cfg.Certificates == nil}, {"Instances", cfg.Instances == nil}, {"Enrollment", cfg.Enrollment == nil},
		{"Metrics", cfg.Metrics == nil}, {"Ready", cfg.Ready == nil}} {
		if r.missing {
			return nil, fmt.Errorf("api: Config.%s is required", r.name)
		}
	}
	// The resource servers first: one that refuses its config leaves
	// nothing half-built behind.
	admin, err := newAdminServer(cfg)
	if err != nil {
		return nil, err
	}
	streams, endStreams := context.WithCancel(context.Background())
	m := cfg.Metrics
	auth := &Authenticator{CA: cfg.CA, Revoked: cfg.Revoked, Clock: cfg.Clock, Log: cfg.Log}
	if !cfg.DisableAudit {
		auth.Store = cfg.Store
	}
	obsUnary, obsStream := observe(m, cfg.Log)
	mapUnary, mapStream := mapErrors(cfg.Log, cfg.Panics)
	tlsCfg := &tls.Config{
		GetCertificate: cfg.GetServerCert,
		// Only request: enrollment must work without a certificate, and the
		// auth interceptor verifies (with the injected clock) and answers
		// Unauthenticated with the reason instead of a torn handshake.
		ClientAuth: tls.RequestClientCert,
		MinVersion: tls.VersionTLS13,
	}
	// Go asks GetCertificate only when Certificates is empty (or the
	// client sent SNI, which one dialling an address does not).
	if cfg.GetServerCert == nil {
		tlsCfg.Certificates = []tls.Certificate{cfg.ServerCert}
	}
	handshake := cfg.Limits.HandshakeTimeout
	if handshake <= 0 {
		handshake = DefaultHandshakeTimeout
	}
	g := grpc.NewServer(
		grpc.Creds(connlimit.Credentials(credentials.NewTLS(tlsCfg), m.HandshakeFailures, func(c *x509.Certificate) bool {
			_, err := cfg.CA.Verify(c, x509.ExtKeyUsageClientAuth)
			return err == nil
		})),
		grpc.ConnectionTimeout(handshake),
		grpc.MaxRecvMsgSize(MaxRecvMsgSize),
		// Most connections are idle agents. gRPC's 32 KiB per-connection
		// read buffer was over half of the heap with 2,000 agents, and even
		// 4 KiB was 10 % of it at 3,000: none at all, since the TLS
		// connection under the framer already holds each decrypted record
		// and answers the framer's small reads from it. The write buffer
		// is released after each flush instead of held per connection.
		grpc.ReadBufferSize(0),
		grpc.SharedWriteBuffer(true),
		// Fixed flow-control windows turn off gRPC's bandwidth-delay
		// estimator. It answers each DATA frame that arrives while none of
		// its pings is out with a WINDOW_UPDATE and a PING, which the peer
		// acks: a heartbeat every 30 s on an otherwise quiet connection
		// always finds none out, so each one cost tetherd a second write
		// and a second wake-up, and the agent a write of its own. 1 MiB
		// keeps a module upload (PushModule) streaming over a long round
		// trip; the estimator could grow the window to 16 MiB.
		grpc.StaticStreamWindowSize(staticWindow),
		grpc.StaticConnWindowSize(staticWindow),
		// FetchModule sends *modulewire.Chunk, framed straight from the
		// buffer ReadAt filled instead of copied into a new one (half the
		// memory traffic of serving a module); every other message goes to
		// the proto codec as usual.
		// A request that does not parse is the client's error
		// (badWireCodec), not an Internal one.
		grpc.ForceServerCodecV2(badWireCodec{modulewire.NewCodec(encoding.GetCodecV2(grpcproto.Name))}),
		grpc.ChainUnaryInterceptor(mapUnary, auth.unary, strictUnary, obsUnary),
		grpc.ChainStreamInterceptor(mapStream, endOnShutdown(streams), auth.stream, strictStream, obsStream),
		// Agents keep one stream open for hours; pings find dead peers.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 2 * time.Minute, Timeout: 20 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 20 * time.Second, PermitWithoutStream: true}),
	)
	s := &Server{GRPC: g, Health: health.NewServer(), Metrics: m, cfg: cfg, streams: streams, endStreams: endStreams}
	v1.RegisterEnrollmentServiceServer(g, &enrollmentServer{Config: cfg, m: m})
	v1.RegisterAgentServiceServer(g, &agentServer{Config: cfg, m: m})
	v1.RegisterAdminServiceServer(g, admin)
	healthpb.RegisterHealthServer(g, s.Health)
	reflection.Register(g)
	for _, svc := range []string{"", "tether.v1.EnrollmentService", "tether.v1.AgentService", "tether.v1.AdminService"} {
		s.Health.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
	}
	return s, nil
}

// Serve accepts connections on lis until Stop, within the configured limits.
func (s *Server) Serve(lis net.Listener) error {
	age := s.cfg.Limits.UnauthenticatedAge
	if age == 0 {
		age = DefaultUnauthenticatedAge
	}
	// Shedding, not refusing: a flood from an address others share (NAT,
	// 127.0.0.1 with the admin CLI, QEMU user networking) closes its own
	// oldest unauthenticated connections, and a verified client gets in.
	return s.GRPC.Serve(connlimit.Wrap(lis, connlimit.Options{
		MaxConns: s.cfg.Limits.MaxConnections, MaxPendingPerSource: s.cfg.Limits.MaxUnauthenticatedPerSource,
		ShedPerSource: true, ShedMax: true, MaxUnauthenticatedAge: max(age, 0),
		// A descriptor is held in real time, whatever the injected clock
		// says: a test that moves it by minutes must not cut its own
		// enrollment connection in the middle of a call.
		AgeClock: clock.Real{},
		Refused:  s.Metrics.ConnectionsRefused, Open: s.Metrics.OpenConnections, Log: s.cfg.Log, Clock: s.cfg.Clock,
	}))
}

// Stop drains: health goes NOT_SERVING, long-lived streams end (agents
// reconnect elsewhere or later), in-flight unary calls finish, and
// whatever is left after grace is cut.
func (s *Server) Stop(grace time.Duration) {
	s.Health.Shutdown()
	s.endStreams()
	done := make(chan struct{})
	go func() { s.GRPC.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		s.GRPC.Stop()
	}
}

type enrollmentServer struct {
	v1.UnimplementedEnrollmentServiceServer
	Config
	m *Metrics
}

// Enroll implements EnrollmentService.
func (e *enrollmentServer) Enroll(ctx context.Context, req *v1.EnrollRequest) (*v1.EnrollResponse, error) {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		if src := throttle.SourceKey(p.Addr.String()); !e.EnrollLimiter.Allow(src) {
			e.m.RateLimited.WithLabelValues("enroll").Inc()
			e.m.Enrollments.WithLabelValues("rate_limited").Inc()
			return nil, fail.Exhausted("too many enrollment attempts from %s; retry in a few seconds", src)
		}
	}
	issued, err := e.Enrollment.Enroll(ctx, req.Token, req.CsrPem)
	if err != nil {
		e.m.Enrollments.WithLabelValues("refused").Inc()
		return nil, err
	}
	e.m.Enrollments.WithLabelValues("issued").Inc()
	return &v1.EnrollResponse{InstanceId: issued.InstanceID.String(), CertificatePem: string(ca.CertPEM(issued.Cert)),
		CaPem: string(ca.CertPEM(e.CA.IssuerOf(issued.Cert))), NotAfter: tsp(issued.Cert.NotAfter), TrustBundle: e.trustBundle()}, nil
}

// endOnShutdown gives every stream a context that also ends when the
// server shuts down.
func endOnShutdown(shutdown context.Context) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, next grpc.StreamHandler) error {
		ctx, cancel := context.WithCancel(ss.Context())
		defer cancel()
		stop := context.AfterFunc(shutdown, cancel)
		defer stop()
		return next(srv, &ctxStream{ServerStream: ss, ctx: ctx})
	}
}
