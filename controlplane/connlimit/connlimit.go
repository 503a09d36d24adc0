// Package connlimit keeps tetherd's gRPC port from spending the
// descriptors its store, listeners and providers need (docs/design.md §9.1).
// It wraps the listener: past a cap on open connections, or past a cap on
// connections from one source address that have not finished their TLS
// handshake, a new connection is closed the moment it is accepted, counted
// in a metric, and logged at most once per interval.
package connlimit

import (
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
)

// Options bound a listener. A zero cap means no cap.
type Options struct {
	// MaxConns caps the connections open at once.
	MaxConns int
	// MaxPendingPerSource caps, per source IP, the connections that have
	// not finished their TLS handshake.
	MaxPendingPerSource int
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
	pending map[string]int
	// refused since the last log line, by reason.
	refused map[string]int
	lastLog time.Time
}

// Wrap bounds l.
func Wrap(l net.Listener, o Options) *Listener {
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.LogEvery <= 0 {
		o.LogEvery = 10 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return &Listener{Listener: l, o: o, pending: map[string]int{}, refused: map[string]int{}}
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
		if reason := l.admit(src); reason != "" {
			// Counted and logged before the close, so whoever sees the
			// connection closed can already see its refusal.
			l.refuse(reason, src)
			_ = c.Close() // refused: nothing was read from it
			continue
		}
		return &Conn{Conn: c, l: l, src: src}, nil
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

func (l *Listener) admit(src string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.o.MaxConns > 0 && l.open >= l.o.MaxConns {
		return ReasonMaxConnections
	}
	if l.o.MaxPendingPerSource > 0 && l.pending[src] >= l.o.MaxPendingPerSource {
		return ReasonPendingSource
	}
	l.open++
	l.pending[src]++
	if l.o.Open != nil {
		l.o.Open.Inc()
	}
	return ""
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
		p[k] = v
	}
	return Stats{Open: l.open, Pending: p}
}

// Conn is an admitted connection; it gives its place back on Close.
type Conn struct {
	net.Conn
	l      *Listener
	src    string
	authed bool // guarded by l.mu
	closed bool // guarded by l.mu
}

// Authenticated marks the connection past its TLS handshake: it no longer
// counts against its source's pending cap.
func (c *Conn) Authenticated() {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	if c.authed || c.closed {
		return
	}
	c.authed = true
	c.l.unpend(c.src)
}

// Close closes the connection and frees its place.
func (c *Conn) Close() error {
	c.l.mu.Lock()
	if !c.closed {
		c.closed = true
		c.l.open--
		if !c.authed {
			c.l.unpend(c.src)
		}
		if c.l.o.Open != nil {
			c.l.o.Open.Dec()
		}
	}
	c.l.mu.Unlock()
	return c.Conn.Close()
}

// unpend needs l.mu held.
func (l *Listener) unpend(src string) {
	if l.pending[src]--; l.pending[src] <= 0 {
		delete(l.pending, src)
	}
}

// Credentials wraps a server's transport credentials so that a connection
// accepted by a Listener is marked authenticated once its handshake
// succeeds. Failed handshakes are counted in failed (may be nil).
func Credentials(inner credentials.TransportCredentials, failed prometheus.Counter) credentials.TransportCredentials {
	return &creds{TransportCredentials: inner, failed: failed}
}

type creds struct {
	credentials.TransportCredentials
	failed prometheus.Counter
}

func (c *creds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		if c.failed != nil {
			c.failed.Inc()
		}
		return conn, info, err
	}
	if tc, ok := raw.(*Conn); ok {
		tc.Authenticated()
	}
	return conn, info, nil
}

func (c *creds) Clone() credentials.TransportCredentials {
	return &creds{TransportCredentials: c.TransportCredentials.Clone(), failed: c.failed}
}
