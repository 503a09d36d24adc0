package pxe

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"time"

	"github.com/mdlayher/ndp"
)

// raEvery is how often an unsolicited advertisement goes out; a router
// solicitation is answered at once.
const raEvery = 10 * time.Second

// openRA opens the router-advertisement socket on the interface, or
// returns nil (logged) when it cannot: DHCP works without it, iPXE just
// waits for IPv6 longer.
//
// The socket binds the interface's link-local address when it is usable.
// While it is not (no carrier yet, as a bridge whose only port is a tap
// that QEMU has not opened, or duplicate address detection still
// running), it binds the unspecified address instead and the kernel
// picks the link-local source of each advertisement once there is one:
// giving up here left iPXE waiting out its IPv6 autoconfiguration on every
// full-mode boot (issue 30: 18 s of "Configuring" against 6 s with a
// router beside it).
func (s *Service) openRA() (*ndp.Conn, *net.Interface) {
	log := s.Log.With("component", "ra")
	ifi, err := net.InterfaceByName(s.Options.Interface)
	if err != nil {
		log.Warn("router advertisements off", "err", err)
		return nil, nil
	}
	c, _, err := ndp.Listen(ifi, ndp.LinkLocal)
	if err == nil {
		return c, ifi
	}
	c, _, uerr := ndp.Listen(ifi, ndp.Unspecified)
	if uerr != nil {
		log.Warn("router advertisements off: the interface has no usable IPv6 link-local address; iPXE may wait 16 s for IPv6", "err", errors.Join(err, uerr))
		return nil, nil
	}
	log.Info("the interface's IPv6 link-local address is not usable yet (no carrier, or duplicate address detection); router advertisements start once it is", "err", err)
	return c, ifi
}

// advertise sends IPv6 router advertisements on c until ctx ends. They
// carry no prefix, no default route (lifetime 0) and neither the managed
// nor the other flag: they only tell iPXE that the link has no IPv6
// configuration to wait for, so its autoconfiguration ends at once.
func (s *Service) advertise(ctx context.Context, c *ndp.Conn, ifi *net.Interface) {
	log := s.Log.With("component", "ra")
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	ra := &ndp.RouterAdvertisement{CurrentHopLimit: 64,
		Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: ifi.HardwareAddr}}}
	send := func() {
		if err := c.WriteTo(ra, nil, netip.IPv6LinkLocalAllNodes()); err != nil && ctx.Err() == nil {
			log.Debug("router advertisement", "err", err)
		}
	}
	if err := c.JoinGroup(netip.MustParseAddr("ff02::2")); err != nil {
		log.Debug("join all-routers group", "err", err)
	}
	send()
	next := time.Now().Add(raEvery)
	for ctx.Err() == nil {
		_ = c.SetReadDeadline(next)
		m, err := s.readRA(c)
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, errRAPanic):
			continue
		case err == nil:
			if _, ok := m.(*ndp.RouterSolicitation); ok {
				send()
			}
		default:
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				send()
				next = time.Now().Add(raEvery)
				continue
			}
			log.Warn("router advertisements stopped", "err", err)
			return
		}
	}
}

// errRAPanic is a solicitation whose parsing panicked (recovered, counted):
// the loop reads the next one.
var errRAPanic = errors.New("panic reading a router solicitation")

// readRA reads one message; a panic in the ndp library's parser of an
// attacker's packet ends that read, not tetherd.
func (s *Service) readRA(c *ndp.Conn) (m ndp.Message, err error) {
	defer func() {
		if v := recover(); v != nil {
			m, err = nil, s.Panics.Note("router advertisements", v)
			err = errors.Join(errRAPanic, err)
		}
	}()
	m, _, _, err = c.ReadFrom()
	return m, err
}
