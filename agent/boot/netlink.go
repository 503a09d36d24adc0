package boot

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"

	"golang.org/x/sys/unix"
)

// rtnl is a minimal rtnetlink client: the three requests the boot path needs
// (link up, add address, set default route). Written against x/sys/unix
// rather than a netlink library so the PID 1 binary stays small and the
// module graph does not grow for three messages.
type rtnl struct {
	fd  int
	seq uint32
}

func dialRtnl() (*rtnl, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("netlink bind: %w", err)
	}
	return &rtnl{fd: fd}, nil
}

func (r *rtnl) Close() error { return unix.Close(r.fd) }

// request sends one message with NLM_F_ACK and waits for its acknowledgement.
// The kernel's errno comes back as the error (unix.Errno, so callers can
// errors.Is it against EEXIST).
func (r *rtnl) request(typ, flags uint16, body []byte) error {
	r.seq++
	seq := r.seq
	msg := make([]byte, unix.SizeofNlMsghdr, unix.SizeofNlMsghdr+len(body))
	msg = append(msg, body...)
	ne := binary.NativeEndian
	ne.PutUint32(msg[0:4], uint32(len(msg)))
	ne.PutUint16(msg[4:6], typ)
	ne.PutUint16(msg[6:8], flags|unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	ne.PutUint32(msg[8:12], seq)
	if err := unix.Sendto(r.fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("netlink send: %w", err)
	}
	buf := make([]byte, os.Getpagesize())
	for {
		n, _, err := unix.Recvfrom(r.fd, buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("netlink receive: %w", err)
		}
		for b := buf[:n]; len(b) >= unix.SizeofNlMsghdr; {
			l := int(ne.Uint32(b[0:4]))
			if l < unix.SizeofNlMsghdr || l > len(b) {
				return errors.New("netlink: malformed reply")
			}
			typ, mseq, data := ne.Uint16(b[4:6]), ne.Uint32(b[8:12]), b[unix.SizeofNlMsghdr:l]
			b = b[min(nlmAlign(l), len(b)):]
			if mseq != seq || typ != unix.NLMSG_ERROR {
				continue
			}
			if len(data) < 4 {
				return errors.New("netlink: short error message")
			}
			if code := int32(ne.Uint32(data[0:4])); code != 0 {
				return unix.Errno(-code)
			}
			return nil
		}
	}
}

func nlmAlign(n int) int { return (n + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }

// attr appends one rtattr (length, type, payload, padding to 4 bytes).
func attr(b []byte, typ uint16, payload []byte) []byte {
	l := unix.SizeofRtAttr + len(payload)
	var h [unix.SizeofRtAttr]byte
	binary.NativeEndian.PutUint16(h[0:2], uint16(l))
	binary.NativeEndian.PutUint16(h[2:4], typ)
	b = append(b, h[:]...)
	b = append(b, payload...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func (r *rtnl) linkUp(index int) error {
	// struct ifinfomsg: family, pad, type, index, flags, change.
	b := make([]byte, unix.SizeofIfInfomsg)
	b[0] = unix.AF_UNSPEC
	binary.NativeEndian.PutUint32(b[4:8], uint32(index))
	binary.NativeEndian.PutUint32(b[8:12], unix.IFF_UP)
	binary.NativeEndian.PutUint32(b[12:16], unix.IFF_UP)
	return r.request(unix.RTM_NEWLINK, 0, b)
}

// addAddr adds an IPv4 address; an address that is already there is fine,
// so a restarted agent (or a second Setup) does not fail on its own work.
func (r *rtnl) addAddr(index int, p netip.Prefix) error {
	// struct ifaddrmsg: family, prefixlen, flags, scope, index.
	b := make([]byte, unix.SizeofIfAddrmsg)
	b[0] = unix.AF_INET
	b[1] = byte(p.Bits())
	b[3] = unix.RT_SCOPE_UNIVERSE
	binary.NativeEndian.PutUint32(b[4:8], uint32(index))
	a := p.Addr().As4()
	b = attr(b, unix.IFA_LOCAL, a[:])
	b = attr(b, unix.IFA_ADDRESS, a[:])
	if p.Bits() < 31 {
		bc := broadcast(p)
		b = attr(b, unix.IFA_BROADCAST, bc[:])
	}
	err := r.request(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL, b)
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	return err
}

func broadcast(p netip.Prefix) [4]byte {
	a := p.Masked().Addr().As4()
	host := ^uint32(0) >> p.Bits()
	v := binary.BigEndian.Uint32(a[:]) | host
	var out [4]byte
	binary.BigEndian.PutUint32(out[:], v)
	return out
}

// replaceDefaultRoute sets the IPv4 default route via gw on the interface,
// replacing one that is already there.
func (r *rtnl) replaceDefaultRoute(index int, gw netip.Addr) error {
	// struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags.
	b := make([]byte, unix.SizeofRtMsg)
	b[0] = unix.AF_INET
	b[4] = unix.RT_TABLE_MAIN
	b[5] = unix.RTPROT_BOOT
	b[6] = unix.RT_SCOPE_UNIVERSE
	b[7] = unix.RTN_UNICAST
	g := gw.As4()
	b = attr(b, unix.RTA_GATEWAY, g[:])
	var oif [4]byte
	binary.NativeEndian.PutUint32(oif[:], uint32(index))
	b = attr(b, unix.RTA_OIF, oif[:])
	return r.request(unix.RTM_NEWROUTE, unix.NLM_F_CREATE|unix.NLM_F_REPLACE, b)
}
