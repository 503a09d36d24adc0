package api

import (
	"context"
	"crypto"
	"crypto/x509"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/audit"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/pki"
	"github.com/tetherfleet/tether/pki/ca"
)

// Caller is the authenticated peer of a call.
type Caller struct {
	Identity  pki.Identity
	Serial    string
	NotAfter  time.Time
	PublicKey crypto.PublicKey
}

type callerKey struct{}

// CallerFrom returns the caller put in the context by the auth interceptor.
func CallerFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

// WithCaller is for tests that call services directly.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

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
	serial := ca.SerialString(cert)
	if err := a.Revoked.check(serial); err != nil {
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
		if !store.Role(c.Identity.Role).AtLeast(acc.role) {
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

// Revocations is the in-memory set of revoked, unexpired certificate
// serials that every authenticated call checks. It is loaded from the
// store, follows revocations from any replica through notifications, and
// is reloaded periodically in case a notification was missed.
type Revocations struct {
	mu     sync.RWMutex
	serial map[string]struct{}
	// onRevoke holds, per serial, the callbacks of the open streams
	// authenticated with it: a revocation reaches its streams without a
	// goroutine per stream or a broadcast to all of them.
	onRevoke map[string]map[*func()]struct{}

	// What Follow keeps, under mu: when the set last loaded, and how many
	// periodic reloads in a row have failed since. Counting reloads rather
	// than reading a clock keeps the bound the same whatever clock the
	// control plane runs on.
	loadedAt time.Time
	failed   int
}

// StaleAfterReloads is how many periodic reloads in a row may fail before
// the set is stale and certificates are refused.
const StaleAfterReloads = 10

var reloadFailuresOpts = prometheus.CounterOpts{Name: "tether_revocation_reload_failures_total",
	Help: "Periodic reloads of the certificate revocation list that failed (past StaleAfterReloads in a row, certificates are refused)."}

// NewRevocations returns an empty set.
func NewRevocations() *Revocations {
	return &Revocations{serial: map[string]struct{}{}, onRevoke: map[string]map[*func()]struct{}{}}
}

// check refuses a revoked serial, and every serial once the set is
// stale: a revocation list that stopped reloading may be missing a
// revocation, and a revoked certificate must not get in (fail closed).
func (r *Revocations) check(serial string) error {
	if loaded, stale := r.Stale(); stale {
		return fail.Unavailable("the certificate revocation list has failed to reload %d times in a row (last loaded %s; see the tetherd log): certificates are refused until it reloads",
			StaleAfterReloads, loaded.UTC().Format(time.RFC3339))
	}
	if r.IsRevoked(serial) {
		return fail.Unauthenticated("client certificate %s is revoked", serial)
	}
	return nil
}

// Stale reports whether StaleAfterReloads periodic reloads in a row have
// failed, and when the set last loaded.
func (r *Revocations) Stale() (time.Time, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.loadedAt, r.failed >= StaleAfterReloads
}

// IsRevoked reports whether serial is revoked.
func (r *Revocations) IsRevoked(serial string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	_, ok := r.serial[serial]
	return ok
}

// Add marks serials revoked and ends the open streams authenticated with
// them.
func (r *Revocations) Add(serials ...string) {
	var ends []func()
	r.mu.Lock()
	for _, s := range serials {
		if _, ok := r.serial[s]; ok {
			continue
		}
		r.serial[s] = struct{}{}
		for f := range r.onRevoke[s] {
			ends = append(ends, *f)
		}
	}
	r.mu.Unlock()
	for _, end := range ends {
		end()
	}
}

// OnRevoke calls end (which must not block) once serial is revoked, at
// once if it already is; stop forgets it.
func (r *Revocations) OnRevoke(serial string, end func()) (stop func()) {
	f := &end
	r.mu.Lock()
	_, revoked := r.serial[serial]
	if !revoked {
		if r.onRevoke[serial] == nil {
			r.onRevoke[serial] = map[*func()]struct{}{}
		}
		r.onRevoke[serial][f] = struct{}{}
	}
	r.mu.Unlock()
	if revoked {
		end()
		return func() {}
	}
	return func() {
		r.mu.Lock()
		delete(r.onRevoke[serial], f)
		if len(r.onRevoke[serial]) == 0 {
			delete(r.onRevoke, serial)
		}
		r.mu.Unlock()
	}
}

// Load replaces the set from the store.
func (r *Revocations) Load(ctx context.Context, s store.Store, now time.Time) error {
	serials, err := s.ListRevokedSerials(ctx, now)
	if err != nil {
		return err
	}
	fresh := make(map[string]struct{}, len(serials))
	for _, x := range serials {
		fresh[x] = struct{}{}
	}
	r.mu.Lock()
	old := r.serial
	r.serial, r.loadedAt, r.failed = fresh, now, 0
	r.mu.Unlock()
	var added []string
	for x := range fresh {
		if _, ok := old[x]; !ok {
			added = append(added, x)
		}
	}
	if len(added) > 0 {
		// Re-add through Add so watchers hear about ones a missed
		// notification would have announced.
		r.mu.Lock()
		for _, x := range added {
			delete(r.serial, x)
		}
		r.mu.Unlock()
		r.Add(added...)
	}
	return nil
}

// Follow keeps the set current until ctx ends: notifications add
// serials as they come, and a reload every period catches any that were
// missed. A failed reload is logged and counted in failures (may be nil);
// after StaleAfterReloads failures in a row the set is stale and
// authentication refuses every certificate until a reload succeeds.
func (r *Revocations) Follow(ctx context.Context, s store.Store, clock interface{ Now() time.Time }, every time.Duration, log *slog.Logger, failures prometheus.Counter) {
	ch, stop := s.Subscribe(store.ChannelRevocations)
	defer stop()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case serial := <-ch:
			r.Add(serial)
		case <-t.C:
			r.reload(ctx, s, clock.Now(), log, failures)
		}
	}
}

// reload is one periodic reload of Follow.
func (r *Revocations) reload(ctx context.Context, s store.Store, now time.Time, log *slog.Logger, failures prometheus.Counter) {
	err := r.Load(ctx, s, now)
	if err == nil || ctx.Err() != nil {
		return
	}
	if failures != nil {
		failures.Inc()
	}
	r.mu.Lock()
	r.failed++
	r.mu.Unlock()
	loaded, stale := r.Stale()
	log.Error("certificate revocation list reload failed", "err", err, "last_loaded", loaded, "refusing_certificates", stale)
}

// NewReloadFailures is the counter Follow's failures go to, registered
// with reg when it is not nil.
func NewReloadFailures(reg prometheus.Registerer) prometheus.Counter {
	c := prometheus.NewCounter(reloadFailuresOpts)
	if reg != nil {
		reg.MustRegister(c)
	}
	return c
}
