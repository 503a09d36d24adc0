package dhcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"

	"github.com/tetherfleet/tether/internal/guard"
)

// Server answers DHCP on one interface.
type Server struct {
	Interface string
	Handler   *Handler
	Log       *slog.Logger
	// Panics records a panic in one packet's handling, which then ends
	// alone (nil: recovered, not counted).
	Panics *guard.Panics
	// Workers bounds the packets handled at once; a flood beyond it is
	// dropped at the socket rather than queued.
	Workers int
	// Addr overrides the listen address (tests); default 0.0.0.0:67.
	Addr *net.UDPAddr

	debug rateLimited
}

// Serve answers until ctx ends. It binds the socket to the interface, so
// nothing is answered, or sent, on any other link.
func (s *Server) Serve(ctx context.Context) error {
	conn, err := s.Listen()
	if err != nil {
		return err
	}
	return s.ServeConn(ctx, conn)
}

// Listen opens the server's socket, bound to the interface.
func (s *Server) Listen() (net.PacketConn, error) {
	addr := s.Addr
	if addr == nil {
		addr = &net.UDPAddr{IP: net.IPv4zero, Port: dhcpv4.ServerPort}
	}
	conn, err := server4.NewIPv4UDPConn(s.Interface, addr)
	if err != nil {
		return nil, fmt.Errorf("dhcp: listen on %s: %w", s.Interface, err)
	}
	return conn, nil
}

// ServeConn answers on conn until ctx ends, then closes it.
func (s *Server) ServeConn(ctx context.Context, conn net.PacketConn) error {
	workers := s.Workers
	if workers <= 0 {
		workers = 64
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	sem := make(chan struct{}, workers)
	for {
		buf := make([]byte, maxPacket+1)
		n, peer, err := conn.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("dhcp: read: %w", err)
		}
		select {
		case sem <- struct{}{}:
		default:
			s.logDebug("dhcp: busy, packet dropped", "peer", peer.String())
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			defer s.Panics.Recover("dhcp")
			s.handle(ctx, conn, peer, buf[:n])
		}()
	}
}

func (s *Server) handle(ctx context.Context, conn net.PacketConn, peer net.Addr, pkt []byte) {
	reply, err := s.Handler.Respond(ctx, pkt)
	var ig *Ignored
	switch {
	case errors.As(err, &ig):
		s.logDebug("dhcp: no reply", "peer", peer.String(), "reason", ig.Reason)
		return
	case err != nil:
		s.Log.Warn("dhcp: no reply", "peer", peer.String(), "err", err)
		return
	}
	dst := Destination(reply, peer)
	if _, err := conn.WriteTo(reply.ToBytes(), dst); err != nil {
		s.Log.Warn("dhcp: send reply", "to", dst.String(), "err", err)
	}
}

// Destination is where a reply goes: to the relay agent's port 67 when the
// request came through one, to a client that has an address at it, and
// otherwise broadcast on the link (a client without an address cannot
// receive unicast before it has one, and no ARP entry exists for it).
func Destination(reply *dhcpv4.DHCPv4, peer net.Addr) *net.UDPAddr {
	if gi := reply.GatewayIPAddr; gi != nil && !gi.IsUnspecified() {
		return &net.UDPAddr{IP: gi, Port: dhcpv4.ServerPort}
	}
	if ci := reply.ClientIPAddr; ci != nil && !ci.IsUnspecified() {
		return &net.UDPAddr{IP: ci, Port: dhcpv4.ClientPort}
	}
	if up, ok := peer.(*net.UDPAddr); ok && up.IP != nil && !up.IP.IsUnspecified() && !up.IP.Equal(net.IPv4bcast) && up.Port == dhcpv4.ClientPort {
		return up
	}
	return &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ClientPort}
}

func (s *Server) logDebug(msg string, args ...any) {
	ok, suppressed := s.debug.allow(s.Handler.Now())
	if !ok {
		return
	}
	if suppressed > 0 {
		args = append(args, "suppressed_since_last", suppressed)
	}
	s.Log.Debug(msg, args...)
}

// rateLimited lets through at most burst log lines per second: a flood of
// bad packets must not become a flood of log lines.
type rateLimited struct {
	mu     sync.Mutex
	window time.Time
	n      int
	// dropped counts suppressed lines, reported with the next one allowed.
	dropped int
}

const logBurst = 10

func (r *rateLimited) allow(now time.Time) (ok bool, suppressed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now.Sub(r.window) >= time.Second {
		r.window, r.n = now, 0
	}
	if r.n >= logBurst {
		r.dropped++
		return false, 0
	}
	r.n++
	suppressed, r.dropped = r.dropped, 0
	return true, suppressed
}
