package enroll

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/tetherfleet/tether/internal/clock"
)

// Endpoint is one control plane address: the dial target and the name its
// certificate must carry.
type Endpoint struct {
	Target, Host string
}

// SplitURLs splits a comma-separated list of control plane URLs.
func SplitURLs(raw string) ([]Endpoint, error) {
	var out []Endpoint
	for _, u := range strings.Split(raw, ",") {
		target, host, err := SplitURL(strings.TrimSpace(u))
		if err != nil {
			return nil, err
		}
		out = append(out, Endpoint{Target: target, Host: host})
	}
	return out, nil
}

// maxFailoverPause bounds the random pause before trying the next control
// plane: the agents of a replica that went away spread over the others
// instead of arriving in the same instant.
const maxFailoverPause = time.Second

// Failover dials the first control plane that answers, starting with the
// one that answered last. When a dial fails, or a TLS handshake fails on
// what it dialled (a control plane refusing connections past its budget
// closes them at once), the next dial moves to the next endpoint after a
// jittered pause. "Next" is in the agent's own order of the endpoints
// after the first, so the agents of a replica that went away spread over
// the others.
type Failover struct {
	Endpoints []Endpoint
	// Dial opens a TCP connection (default: a net.Dialer).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Pause is the wait before trying the next endpoint (default: random
	// up to maxFailoverPause).
	Pause func() time.Duration
	// Clock times the pause (default: the wall clock).
	Clock clock.Clock
	Logf  func(format string, args ...any)
	// Shuffle orders the endpoints after the first for this agent
	// (default: math/rand/v2's Shuffle). A fleet is given one list; were
	// "the next" the same endpoint for every agent, all the agents of a
	// replica that went away would land on one other replica.
	Shuffle func(n int, swap func(i, j int))

	next     atomic.Int64 // a position in order
	once     sync.Once
	orderArr []int // endpoint indexes: the first, then the others in this agent's order
}

// order is the agent's walk over the endpoints: the first one given, then
// the others in an order of its own.
func (f *Failover) order() []int {
	f.once.Do(func() {
		f.orderArr = make([]int, len(f.Endpoints))
		for i := range f.orderArr {
			f.orderArr[i] = i
		}
		shuffle := f.Shuffle
		if shuffle == nil {
			shuffle = mrand.Shuffle
		}
		if rest := f.orderArr[1:]; len(rest) > 1 {
			shuffle(len(rest), func(i, j int) { rest[i], rest[j] = rest[j], rest[i] })
		}
	})
	return f.orderArr
}

// endpointConn remembers which endpoint a connection reached (its
// position in the agent's order), so the handshake verifies that
// endpoint's name.
type endpointConn struct {
	net.Conn
	pos int
	ep  Endpoint
}

// DialContext is a grpc.WithContextDialer dialer; it ignores gRPC's
// target, which names only the first endpoint.
func (f *Failover) DialContext(ctx context.Context, _ string) (net.Conn, error) {
	dial := f.Dial
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	order := f.order()
	n := len(order)
	start := int(f.next.Load()) % n
	var errs []error
	for i := 0; i < n; i++ {
		pos := (start + i) % n
		k := order[pos]
		if i > 0 {
			if err := f.pause(ctx); err != nil {
				return nil, errors.Join(append(errs, err)...)
			}
		}
		c, err := dial(ctx, "tcp", f.Endpoints[k].Target)
		if err == nil {
			f.next.Store(int64(pos))
			return &endpointConn{Conn: c, pos: pos, ep: f.Endpoints[k]}, nil
		}
		errs = append(errs, fmt.Errorf("control plane %s: %w", f.Endpoints[k].Target, err))
		if n > 1 {
			f.logf("control plane %s is unreachable (%v); trying %s next", f.Endpoints[k].Target, err, f.Endpoints[order[(pos+1)%n]].Target)
		}
	}
	f.next.Store(int64((start + 1) % n)) // none answered: the next round starts further on
	return nil, errors.Join(errs...)
}

func (f *Failover) pause(ctx context.Context) error {
	d := time.Duration(mrand.Int64N(int64(maxFailoverPause)))
	if f.Pause != nil {
		d = f.Pause()
	}
	if d <= 0 {
		return ctx.Err()
	}
	clk := f.Clock
	if clk == nil {
		clk = clock.Real{}
	}
	t := clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C():
		return nil
	}
}

// refused moves the next dial past the endpoint at position pos of the
// agent's order, unless another dial has already moved it.
func (f *Failover) refused(pos int) {
	order := f.order()
	next := (pos + 1) % len(order)
	if f.next.CompareAndSwap(int64(pos), int64(next)) {
		f.logf("control plane %s refused the connection; trying %s next", f.Endpoints[order[pos]].Target, f.Endpoints[order[next]].Target)
	}
}

func (f *Failover) logf(format string, args ...any) {
	if f.Logf != nil {
		f.Logf(format, args...)
	}
}

// Credentials wraps base (a pinned TLS configuration) so each handshake
// verifies the name of the endpoint it reached, and a failed handshake
// moves the next dial on.
func (f *Failover) Credentials(base *tls.Config, pin *Pin) credentials.TransportCredentials {
	return &failoverCreds{TransportCredentials: credentials.NewTLS(base), base: base, pin: pin, f: f}
}

type failoverCreds struct {
	credentials.TransportCredentials
	base *tls.Config
	pin  *Pin
	f    *Failover
}

func (c *failoverCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	ec, ok := raw.(*endpointConn)
	if !ok {
		return c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	}
	cfg := c.base.Clone()
	cfg.ServerName = ec.ep.Host
	// Go sends no server name for an IP address, so the pin is told which
	// endpoint to check rather than reading it from the handshake.
	host := ec.ep.Host
	cfg.VerifyConnection = func(cs tls.ConnectionState) error { return c.pin.verifyName(cs, host) }
	conn, info, err := credentials.NewTLS(cfg).ClientHandshake(ctx, ec.ep.Host, raw)
	if err != nil {
		c.f.refused(ec.pos)
	}
	return conn, info, err
}

func (c *failoverCreds) Clone() credentials.TransportCredentials {
	return &failoverCreds{TransportCredentials: c.TransportCredentials.Clone(), base: c.base.Clone(), pin: c.pin, f: c.f}
}
