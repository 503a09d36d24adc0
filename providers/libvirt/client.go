package libvirt

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"
)

// hypervisor is the part of libvirtd's API the provider uses: one session
// (a connection) per provider operation. It is an interface so the unit
// tests can run every path against an in-memory libvirtd.
type hypervisor interface {
	Capabilities() (string, error)
	LookupByName(name string) (golibvirt.Domain, error)
	DefineXML(xml string) (golibvirt.Domain, error)
	Create(d golibvirt.Domain) error
	Shutdown(d golibvirt.Domain) error
	Destroy(d golibvirt.Domain) error
	Undefine(d golibvirt.Domain, flags golibvirt.DomainUndefineFlagsValues) error
	State(d golibvirt.Domain) (golibvirt.DomainState, int32, error)
	ListAll() ([]golibvirt.Domain, error)
	// XMLDesc is the domain's persistent definition.
	XMLDesc(d golibvirt.Domain) (string, error)
	// Metadata returns the inner text of the domain's element in ns.
	Metadata(d golibvirt.Domain, ns string) (string, error)
	// LifecycleEvents streams every domain's lifecycle events until ctx
	// ends or the connection drops (then the channel closes).
	LifecycleEvents(ctx context.Context) (<-chan golibvirt.DomainEventLifecycleMsg, error)
	Close() error
}

// dialFunc opens a session with libvirtd. The session must end (its calls
// fail) when ctx ends.
type dialFunc func(ctx context.Context) (hypervisor, error)

// errSessionEnded is what a call in a session whose context ended gets.
var errSessionEnded = errors.New("libvirt session ended (deadline or cancellation) before libvirtd answered")

// rpcSession is a hypervisor over one go-libvirt connection.
type rpcSession struct {
	l    *golibvirt.Libvirt
	conn *trackedConn
	stop func() bool
	ctx  context.Context
}

// trackedConn lets the session close the socket itself: go-libvirt's
// Disconnect first sends a request, which would hang on a libvirtd that no
// longer answers, while closing the socket makes every pending call fail.
type trackedConn struct {
	dial func() (net.Conn, error)
	mu   sync.Mutex
	c    net.Conn
}

func (t *trackedConn) Dial() (net.Conn, error) {
	c, err := t.dial()
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	t.c = c
	t.mu.Unlock()
	return c, nil
}

func (t *trackedConn) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.c != nil {
		_ = t.c.Close()
	}
}

// rpcDialer returns the dialFunc for a parsed URI.
func rpcDialer(t target) dialFunc {
	return func(ctx context.Context) (hypervisor, error) {
		tc := &trackedConn{dial: innerDialer(ctx, t)}
		l := golibvirt.NewWithDialer(tc)
		done := make(chan error, 1)
		go func() { done <- l.ConnectToURI(golibvirt.ConnectURI(t.remote)) }()
		select {
		case err := <-done:
			if err != nil {
				tc.close()
				return nil, fmt.Errorf("connect to libvirtd (%s): %w", describe(t), err)
			}
		case <-ctx.Done():
			tc.close()
			return nil, fmt.Errorf("connect to libvirtd (%s): %w", describe(t), ctx.Err())
		}
		s := &rpcSession{l: l, conn: tc, ctx: ctx}
		s.stop = context.AfterFunc(ctx, tc.close)
		return s, nil
	}
}

func describe(t target) string {
	if t.transport == "unix" {
		return "socket " + t.socket
	}
	return t.transport + " " + t.host
}

// innerDialer dials one transport, bounded by ctx where the transport
// allows it.
func innerDialer(ctx context.Context, t target) func() (net.Conn, error) {
	switch t.transport {
	case "tls":
		var opts []dialers.TLSOption
		host := t.host
		if h, port, err := net.SplitHostPort(t.host); err == nil {
			host = h
			opts = append(opts, dialers.UseTLSPort(port))
		}
		if t.pkiPath != "" {
			opts = append(opts, dialers.UsePKIPath(t.pkiPath))
		}
		return dialers.NewTLS(host, opts...).Dial
	case "tcp":
		addr := t.host
		if _, _, err := net.SplitHostPort(addr); err != nil {
			addr = net.JoinHostPort(addr, "16509")
		}
		return func() (net.Conn, error) { return (&net.Dialer{}).DialContext(ctx, "tcp", addr) }
	default:
		return func() (net.Conn, error) { return (&net.Dialer{}).DialContext(ctx, "unix", t.socket) }
	}
}

func (s *rpcSession) LifecycleEvents(ctx context.Context) (<-chan golibvirt.DomainEventLifecycleMsg, error) {
	ch, err := s.l.LifecycleEvents(ctx)
	return ch, s.call(err)
}

// call runs one RPC, turning a call cut short by the session's end into an
// error that says so (go-libvirt only says "interrupted").
func (s *rpcSession) call(err error) error {
	if err != nil && s.ctx.Err() != nil && errors.Is(err, golibvirt.ErrInterrupted) {
		return fmt.Errorf("%w: %w", errSessionEnded, s.ctx.Err())
	}
	return err
}

func (s *rpcSession) Capabilities() (string, error) {
	c, err := s.l.ConnectGetCapabilities()
	return c, s.call(err)
}

func (s *rpcSession) LookupByName(name string) (golibvirt.Domain, error) {
	d, err := s.l.DomainLookupByName(name)
	return d, s.call(err)
}

func (s *rpcSession) DefineXML(xml string) (golibvirt.Domain, error) {
	d, err := s.l.DomainDefineXMLFlags(xml, golibvirt.DomainDefineValidate)
	return d, s.call(err)
}

func (s *rpcSession) Create(d golibvirt.Domain) error { return s.call(s.l.DomainCreate(d)) }

func (s *rpcSession) Shutdown(d golibvirt.Domain) error {
	return s.call(s.l.DomainShutdownFlags(d, golibvirt.DomainShutdownAcpiPowerBtn))
}

func (s *rpcSession) Destroy(d golibvirt.Domain) error { return s.call(s.l.DomainDestroy(d)) }

func (s *rpcSession) Undefine(d golibvirt.Domain, flags golibvirt.DomainUndefineFlagsValues) error {
	return s.call(s.l.DomainUndefineFlags(d, flags))
}

func (s *rpcSession) State(d golibvirt.Domain) (golibvirt.DomainState, int32, error) {
	st, reason, err := s.l.DomainGetState(d, 0)
	return golibvirt.DomainState(st), reason, s.call(err)
}

func (s *rpcSession) ListAll() ([]golibvirt.Domain, error) {
	ds, _, err := s.l.ConnectListAllDomains(1, golibvirt.ConnectListDomainsActive|golibvirt.ConnectListDomainsInactive)
	return ds, s.call(err)
}

func (s *rpcSession) XMLDesc(d golibvirt.Domain) (string, error) {
	x, err := s.l.DomainGetXMLDesc(d, golibvirt.DomainXMLInactive)
	return x, s.call(err)
}

func (s *rpcSession) Metadata(d golibvirt.Domain, ns string) (string, error) {
	x, err := s.l.DomainGetMetadata(d, int32(golibvirt.DomainMetadataElement), golibvirt.OptString{ns}, golibvirt.DomainAffectCurrent)
	return x, s.call(err)
}

// Close ends the session. A libvirtd that still answers gets a proper
// goodbye; one that does not has its socket closed under it.
func (s *rpcSession) Close() error {
	s.stop()
	if s.ctx.Err() != nil {
		s.conn.close()
		return nil
	}
	done := make(chan error, 1)
	go func() { done <- s.l.Disconnect() }()
	select {
	case err := <-done:
		if err != nil && !strings.Contains(err.Error(), "closed") {
			return err
		}
		return nil
	case <-s.ctx.Done():
		s.conn.close()
		return nil
	}
}
