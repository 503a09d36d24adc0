// Package connlimit keeps tetherd's gRPC port from spending the
// descriptors its store, listeners and providers need (docs/design.md §9.1).
// It wraps the listener: past a cap on open connections, or past a cap on
// unauthenticated connections from one source address, a new connection
// is closed the moment it is accepted, or, when the listener sheds, the
// oldest unauthenticated connection is closed to make room for it; either
// is counted in a metric and logged at most once per interval.
//
// A connection is unauthenticated until its TLS handshake ends with a
// client certificate the server's CA signed: one that finished TLS and
// HTTP/2 without a certificate (Enrollment needs none) stays in its
// source's count for its whole life, and is closed MaxUnauthenticatedAge
// after it was accepted, whatever it sends (docs/adr/0016).
package connlimit

import (
	"container/list"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/credentials"

	"github.com/tetherfleet/tether/internal/clock"
)

// Refusal reasons, the values of the refusal metric's reason label.
const (
	ReasonMaxConnections = "max_connections"
	ReasonPendingSource  = "unauthenticated_per_source"
	// The shed reasons count old connections closed to admit a new one.
	ReasonShedMax    = "shed_max_connections"
	ReasonShedSource = "shed_unauthenticated_per_source"
	// ReasonUnauthenticatedAge counts certificate-less connections closed
	// at their age limit.
	ReasonUnauthenticatedAge = "unauthenticated_age"
)

// Options bound a listener. A zero cap means no cap.
type Options struct {
	// MaxConns caps the connections open at once.
	MaxConns int
	// MaxPendingPerSource caps, per source IP, the unauthenticated
	// connections (handshaking, or handshaken without a certificate).
	MaxPendingPerSource int
	// ShedPerSource: at a source's cap, close that source's oldest
	// unauthenticated connection instead of refusing the new one, so that
	// a flood from an address shared with others (NAT, 127.0.0.1, QEMU
	// user networking) cannot lock those others out.
	ShedPerSource bool
	// ShedMax: at MaxConns, close the oldest unauthenticated connection
	// of any source instead of refusing; refuse only when none is left.
	ShedMax bool
	// MaxUnauthenticatedAge closes a connection still unauthenticated
	// this long after its accept (zero: never), timed by AgeClock
	// (default: Clock).
	MaxUnauthenticatedAge time.Duration
	AgeClock              clock.Clock
	// Refused counts refusals by reason; Open is the open connections.
	// Either may be nil.
	Refused *prometheus.CounterVec
	Open    prometheus.Gauge
	Log     *slog.Logger
	Clock   clock.Clock
	// LogEvery is the least time between two refusal log lines (default 10 s).
	LogEvery time.Duration
}

// Listener is a net.Listener that refuses connections past its caps.
type Listener struct {
	net.Listener
	o Options

	mu      sync.Mutex
	open    int
	pending map[string]*list.List // of *Conn, oldest first
	// unauth is every unauthenticated connection, oldest first.
	unauth *list.List
	// refused since the last log line, by reason.
	refused map[string]int
	lastLog time.Time
}

// Wrap bounds l.
func Wrap(l net.Listener, o Options) *Listener {
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.AgeClock == nil {
		o.AgeClock = o.Clock
	}
	if o.LogEvery <= 0 {
		o.LogEvery = 10 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return &Listener{Listener: l, o: o, pending: map[string]*list.List{}, unauth: list.New(), refused: map[string]int{}}
}

// Accept returns the next connection within the caps; the ones past them
// are closed at once, so they hold a descriptor for microseconds.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := sourceOf(c.RemoteAddr())
		conn := &Conn{Conn: c, l: l, src: src}
		shed, reason := l.admit(conn)
		for _, s := range shed {
			l.refuse(s.reason, s.c.src)
			_ = s.c.Conn.Close() // its place is already given back
		}
		if reason != "" {
			// Counted and logged before the close, so whoever sees the
			// connection closed can already see its refusal.
			l.refuse(reason, src)
			_ = c.Close() // refused: nothing was read from it
			continue
		}
		if age := l.o.MaxUnauthenticatedAge; age > 0 {
			conn.timer = l.o.AgeClock.AfterFunc(age, conn.expire)
		}
		return conn, nil
	}
}

func sourceOf(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

type shedConn struct {
	c      *Conn
	reason string
}

// admit takes c in or says why not; shed are older connections it closed
// the books on to make room, for the caller to close.
func (l *Listener) admit(c *Conn) (shed []shedConn, reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.o.MaxPendingPerSource > 0 {
		if q := l.pending[c.src]; q != nil && q.Len() >= l.o.MaxPendingPerSource {
			if !l.o.ShedPerSource {
				return nil, ReasonPendingSource
			}
			old := q.Front().Value.(*Conn)
			l.forget(old)
			shed = append(shed, shedConn{old, ReasonShedSource})
		}
	}
	if l.o.MaxConns > 0 && l.open >= l.o.MaxConns {
		if !l.o.ShedMax || l.unauth.Len() == 0 {
			// Nothing is closed for a connection that is refused anyway:
			// the per-source shed above stays, having freed a place.
			return shed, ReasonMaxConnections
		}
		old := l.unauth.Front().Value.(*Conn)
		l.forget(old)
		shed = append(shed, shedConn{old, ReasonShedMax})
	}
	l.open++
	q := l.pending[c.src]
	if q == nil {
		q = list.New()
		l.pending[c.src] = q
	}
	c.srcElem = q.PushBack(c)
	c.allElem = l.unauth.PushBack(c)
	if l.o.Open != nil {
		l.o.Open.Inc()
	}
	return shed, ""
}

func (l *Listener) refuse(reason, src string) {
	if l.o.Refused != nil {
		l.o.Refused.WithLabelValues(reason).Inc()
	}
	now := l.o.Clock.Now()
	l.mu.Lock()
	l.refused[reason]++
	if now.Sub(l.lastLog) < l.o.LogEvery {
		l.mu.Unlock()
		return
	}
	counts := l.refused
	l.refused, l.lastLog = map[string]int{}, now
	open := l.open
	l.mu.Unlock()
	l.o.Log.Warn("refusing connections", "refused_since_last_line", counts, "last_source", src, "open", open,
		"max_connections", l.o.MaxConns, "max_unauthenticated_per_source", l.o.MaxPendingPerSource)
}

// Stats is a snapshot for tests and logs.
type Stats struct {
	Open    int
	Pending map[string]int
}

// Stats reports the open connections and the pending ones per source.
func (l *Listener) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := make(map[string]int, len(l.pending))
	for k, v := range l.pending {
		p[k] = v.Len()
	}
	return Stats{Open: l.open, Pending: p}
}

// Conn is an admitted connection; it gives its place back on Close.
type Conn struct {
	net.Conn
	l     *Listener
	src   string
	timer clock.Timer // the age limit; nil without one
	// guarded by l.mu:
	authed, closed   bool
	srcElem, allElem *list.Element
}

// Authenticated marks the connection as a verified client's: it no longer
// counts against its source's unauthenticated cap, is never shed and has
// no age limit.
func (c *Conn) Authenticated() {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	if c.authed || c.closed {
		return
	}
	c.authed = true
	c.l.unpend(c)
	if c.timer != nil {
		c.timer.Stop()
	}
}

// expire closes a connection still unauthenticated at its age limit.
func (c *Conn) expire() {
	c.l.mu.Lock()
	expired := !c.authed && !c.closed
	c.l.mu.Unlock()
	if expired {
		c.l.refuse(ReasonUnauthenticatedAge, c.src)
		_ = c.Close()
	}
}

// Close closes the connection and frees its place.
func (c *Conn) Close() error {
	c.l.mu.Lock()
	c.l.forget(c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}

// forget gives c's place back once (l.mu held).
func (l *Listener) forget(c *Conn) {
	if c.closed {
		return
	}
	c.closed = true
	l.open--
	if !c.authed {
		l.unpend(c)
	}
	if c.timer != nil {
		c.timer.Stop()
	}
	if l.o.Open != nil {
		l.o.Open.Dec()
	}
}

// unpend takes c out of the unauthenticated lists (l.mu held).
func (l *Listener) unpend(c *Conn) {
	if q := l.pending[c.src]; q != nil && c.srcElem != nil {
		q.Remove(c.srcElem)
		if q.Len() == 0 {
			delete(l.pending, c.src)
		}
	}
	if c.allElem != nil {
		l.unauth.Remove(c.allElem)
	}
	c.srcElem, c.allElem = nil, nil
}

// Credentials wraps a server's transport credentials so that a connection
// accepted by a Listener is marked authenticated once its handshake
// succeeds with a client certificate that verify accepts (nil: any
// certificate; a self-signed one then counts, so servers pass their CA's
// check). Failed handshakes are counted in failed (may be nil).
func Credentials(inner credentials.TransportCredentials, failed prometheus.Counter, verify func(*x509.Certificate) bool) credentials.TransportCredentials {
	return &creds{TransportCredentials: inner, failed: failed, verify: verify}
}

type creds struct {
	credentials.TransportCredentials
	failed prometheus.Counter
	verify func(*x509.Certificate) bool
}

func (c *creds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		if c.failed != nil {
			c.failed.Inc()
		}
		return conn, info, err
	}
	if tc, ok := raw.(*Conn); ok && c.certified(info) {
		tc.Authenticated()
	}
	return conn, info, nil
}

func (c *creds) certified(info credentials.AuthInfo) bool {
	var state tls.ConnectionState
	switch ti := info.(type) {
	case credentials.TLSInfo:
		state = ti.State
	case *credentials.TLSInfo:
		state = ti.State
	default:
		return false
	}
	if len(state.PeerCertificates) == 0 {
		return false
	}
	return c.verify == nil || c.verify(state.PeerCertificates[0])
}

func (c *creds) Clone() credentials.TransportCredentials {
	return &creds{TransportCredentials: c.TransportCredentials.Clone(), failed: c.failed, verify: c.verify}
}
