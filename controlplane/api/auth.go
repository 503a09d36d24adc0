package api

import (
	"context"
	"crypto/x509"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/api/admin/adminkit"
	"github.com/tetherfleet/tether/controlplane/audit"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/revocation"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/pki"
	"github.com/tetherfleet/tether/pki/ca"
)

// Caller is the authenticated peer of a call (defined in adminkit, which
// the resource packages read it from).
type Caller = adminkit.Caller

// CallerFrom returns the caller put in the context by the auth interceptor.
func CallerFrom(ctx context.Context) (Caller, bool) { return adminkit.CallerFrom(ctx) }

// WithCaller is for tests that call services directly.
func WithCaller(ctx context.Context, c Caller) context.Context { return adminkit.WithCaller(ctx, c) }

const (
	enrollmentPrefix = "/tether.v1.EnrollmentService/"
	agentPrefix      = "/tether.v1.AgentService/"
	adminPrefix      = "/tether.v1.AdminService/"
)

// Authenticator checks client certificates and what they may call.
type Authenticator struct {
	CA      *ca.CA
	Revoked *Revocations
	// Store and Clock record the audit trail; a nil Store records none.
	Store store.Store
	Clock interface{ Now() time.Time }
	Log   *slog.Logger
}

// authenticate verifies the peer's certificate against the CA at the
// injected clock's time, then revocation. TLS only requests the
// certificate (the enrollment service must work without one), so every
// check of an authenticated call happens here, where it can answer with
// a clear Unauthenticated instead of a torn handshake.
func (a *Authenticator) authenticate(ctx context.Context) (Caller, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return Caller{}, fail.Unauthenticated("no peer information")
	}
	tlsInfo, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(tlsInfo.State.PeerCertificates) == 0 {
		return Caller{}, fail.Unauthenticated("a client certificate is required (use the admin certificate from `tetherd init`, or the node certificate from enrollment)")
	}
	cert := tlsInfo.State.PeerCertificates[0]
	id, err := a.CA.Verify(cert, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return Caller{}, fail.Unauthenticated("client certificate refused: %v", err)
	}
	serial := store.CertSerial(ca.SerialString(cert))
	if err := a.Revoked.Check(serial); err != nil {
		return Caller{}, err
	}
	return Caller{Identity: id, Serial: serial, NotAfter: cert.NotAfter, PublicKey: cert.PublicKey}, nil
}

func (a *Authenticator) authorize(ctx context.Context, method string) (context.Context, error) {
	switch {
	case strings.HasPrefix(method, enrollmentPrefix):
		return ctx, nil
	case strings.HasPrefix(method, agentPrefix):
		c, err := a.authenticate(ctx)
		if err != nil {
			return nil, err
		}
		if c.Identity.Kind != pki.KindInstance {
			return nil, fail.Denied("%s needs a node certificate; this is a %s certificate (%s)", method, c.Identity.Kind, c.Identity)
		}
		return WithCaller(ctx, c), nil
	case strings.HasPrefix(method, adminPrefix):
		c, err := a.authenticate(ctx)
		if err != nil {
			return nil, err
		}
		if c.Identity.Kind != pki.KindAdmin {
			return nil, fail.Denied("%s needs an admin certificate; this is a %s certificate (%s)", method, c.Identity.Kind, c.Identity)
		}
		acc, ok := accessOf(method)
		if !ok {
			return nil, fail.Denied("%s is not in the role table; refused for every role", method)
		}
		if !adminkit.AtLeast(c.Identity.Role, acc.role) {
			return WithCaller(ctx, c), fail.Denied("%s needs role %s; certificate %s has role %s", method, acc.role, c.Identity.Name, c.Identity.Role)
		}
		return WithCaller(ctx, c), nil
	default:
		// Health and reflection: public by design, they reveal no fleet data.
		return ctx, nil
	}
}

func (a *Authenticator) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	actx, err := a.authorize(ctx, info.FullMethod)
	e := a.auditEntry(actx, info.FullMethod, req)
	if err != nil {
		a.finish(ctx, e, err)
		return nil, err
	}
	if e != nil {
		actx = audit.With(actx, e)
	}
	resp, err := next(actx, req)
	a.finish(ctx, e, err)
	return resp, err
}

func (a *Authenticator) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, next grpc.StreamHandler) error {
	actx, err := a.authorize(ss.Context(), info.FullMethod)
	// A stream's request arrives after this point; its target is not known.
	e := a.auditEntry(actx, info.FullMethod, nil)
	if err != nil {
		a.finish(ss.Context(), e, err)
		return err
	}
	if e != nil {
		actx = audit.With(actx, e)
	}
	// An admin's open stream (events --watch, audit --watch, the
	// dashboard's event feed) ends when its certificate is revoked, as an
	// agent's does: authentication at the start is not enough for a
	// stream that lasts for days.
	if c, ok := CallerFrom(actx); ok && c.Identity.Kind == pki.KindAdmin && a.Revoked != nil {
		sctx, cancel := context.WithCancel(actx)
		var revoked atomic.Bool
		defer a.Revoked.OnRevoke(c.Serial, func() { revoked.Store(true); cancel() })()
		defer cancel()
		err = next(srv, &ctxStream{ServerStream: ss, ctx: sctx})
		if revoked.Load() {
			err = fail.Unauthenticated("certificate %s was revoked", c.Serial)
		}
	} else {
		err = next(srv, &ctxStream{ServerStream: ss, ctx: actx})
	}
	a.finish(ss.Context(), e, err)
	return err
}

// auditEntry starts the record of an audited admin call by an
// authenticated admin identity (nil otherwise: a call without a valid
// certificate names nobody, and recording it would let anyone fill the
// trail).
func (a *Authenticator) auditEntry(ctx context.Context, method string, req any) *audit.Entry {
	if a.Store == nil || ctx == nil || !strings.HasPrefix(method, adminPrefix) {
		return nil
	}
	acc, ok := accessOf(method)
	if !ok || !acc.audit {
		return nil
	}
	c, ok := CallerFrom(ctx)
	if !ok || c.Identity.Kind != pki.KindAdmin {
		return nil
	}
	return audit.NewEntry(store.AuditRecord{At: a.Clock.Now(), Identity: c.Identity.Name, Role: store.Role(c.Identity.Role), Serial: c.Serial,
		Method: method[strings.LastIndex(method, "/")+1:], Target: audit.Target(req)})
}

func (a *Authenticator) finish(ctx context.Context, e *audit.Entry, err error) {
	if e == nil {
		return
	}
	if aerr := audit.Finish(ctx, a.Store, e, status.Code(fail.From(err)).String()); aerr != nil && a.Log != nil {
		a.Log.Error("audit record lost", "err", aerr)
	}
}

type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *ctxStream) Context() context.Context { return s.ctx }

// Revocations is the in-memory set of revoked serials every authenticated
// call checks (controlplane/revocation).
type Revocations = revocation.Set

// StaleAfterReloads is how many periodic reloads in a row may fail before
// the set is stale and certificates are refused.
const StaleAfterReloads = revocation.StaleAfterReloads

// NewRevocations returns an empty set.
func NewRevocations() *Revocations { return revocation.NewSet() }

// NewReloadFailures is the counter the set's failed reloads go to,
// registered with reg when it is not nil.
func NewReloadFailures(reg prometheus.Registerer) prometheus.Counter {
	return revocation.NewReloadFailures(reg)
}
