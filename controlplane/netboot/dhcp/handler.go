// Package dhcp is tetherd's netboot DHCP responder. In proxy mode it
// answers PXE and iPXE clients with boot information only, beside the
// site's DHCP server; in full mode it also leases addresses from a range,
// for an isolated provisioning network.
//
// The decision for one packet is Handler.Respond: bytes in, a reply (or
// none) out, with the lease store behind an interface, so every rule is
// unit- and fuzz-tested without a socket. Server puts it on an interface.
package dhcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"

	"github.com/tetherfleet/tether/internal/macaddr"
)

// Mode is how the responder joins the network.
type Mode string

// Modes.
const (
	// Proxy answers PXE clients with boot information and no address.
	Proxy Mode = "proxy"
	// Full also leases addresses.
	Full Mode = "full"
)

// Loader file names, as Debian's ipxe package ships them.
const (
	LoaderBIOS = "undionly.kpxe"
	LoaderUEFI = "ipxe.efi"
)

// Config is what the responder says.
type Config struct {
	Mode Mode
	// ServerIP is tetherd's address on the interface: the next server
	// (siaddr, option 54) that PXE clients fetch their loader from by TFTP.
	ServerIP netip.Addr
	// HTTPBase is the netboot HTTP server as machines reach it
	// ("http://10.213.0.1:8080"): iPXE gets its boot URL under it and UEFI
	// HTTP Boot its loader.
	HTTPBase string
	// UEFILoader is the TFTP name of the UEFI loader (LoaderUEFI or snponly.efi).
	UEFILoader string

	// Full mode only.
	Pool      Pool
	Router    netip.Addr // optional
	DNS       netip.Addr // optional
	LeaseTime time.Duration
}

// Pool is the address range of full mode.
type Pool struct {
	First, Last netip.Addr
	Mask        net.IPMask
}

// Contains reports whether a is in the range.
func (p Pool) Contains(a netip.Addr) bool {
	return a.Is4() && p.First.Compare(a) <= 0 && a.Compare(p.Last) <= 0
}

// Leases hands out addresses in full mode.
type Leases interface {
	// Lease returns the address leased to mac, extended to now+d, leasing
	// a free one of the pool when mac has none. ErrPoolExhausted when
	// none is free.
	Lease(ctx context.Context, mac string, now time.Time, d time.Duration) (netip.Addr, error)
	// Current is mac's unexpired lease, if any.
	Current(ctx context.Context, mac string, now time.Time) (netip.Addr, bool, error)
	// Release ends mac's lease.
	Release(ctx context.Context, mac string) error
}

// UKIChooser reports whether the machine with this hardware address boots
// a unified kernel image (netboot.Server.BootsUKI).
type UKIChooser interface {
	BootsUKI(ctx context.Context, mac string) (bool, error)
}

// ErrPoolExhausted means every address of the range is leased.
var ErrPoolExhausted = errors.New("no free address in the DHCP range")

// Handler decides replies.
type Handler struct {
	Config Config
	Leases Leases // full mode
	Now    func() time.Time
	// UKI, when set, says which machines boot a signed unified kernel
	// image: their UEFI HTTP Boot gets the image's URL instead of the
	// iPXE loader's (ADR 0035).
	UKI UKIChooser

	flood floodGuard
}

// Validate checks a configuration.
func (c *Config) Validate() error {
	switch c.Mode {
	case Proxy, Full:
	default:
		return fmt.Errorf("dhcp mode %q: want proxy or full", c.Mode)
	}
	if !c.ServerIP.Is4() {
		return fmt.Errorf("dhcp server address %v: want an IPv4 address", c.ServerIP)
	}
	if !strings.HasPrefix(c.HTTPBase, "http://") {
		return fmt.Errorf("netboot URL %q: iPXE and UEFI HTTP Boot need an http:// URL", c.HTTPBase)
	}
	if c.UEFILoader == "" {
		c.UEFILoader = LoaderUEFI
	}
	if c.Mode == Proxy {
		if c.Pool.First.IsValid() || c.Router.IsValid() || c.DNS.IsValid() {
			return errors.New("--dhcp-range, --dhcp-router and --dhcp-dns need --dhcp-mode full: proxy mode hands out no address")
		}
		return nil
	}
	p := c.Pool
	if !p.First.Is4() || !p.Last.Is4() || p.Last.Less(p.First) {
		return fmt.Errorf("dhcp range %v-%v: want FIRST-LAST, two IPv4 addresses in order", p.First, p.Last)
	}
	if p.Size() > maxPoolSize {
		return fmt.Errorf("dhcp range %v-%v: %d addresses is more than %d", p.First, p.Last, p.Size(), maxPoolSize)
	}
	if len(p.Mask) != 4 {
		return errors.New("dhcp range: no netmask (the interface's subnet)")
	}
	if p.Contains(c.ServerIP) {
		return fmt.Errorf("dhcp range %v-%v contains the server's own address %v", p.First, p.Last, c.ServerIP)
	}
	sub := net.IPNet{IP: net.IP(c.ServerIP.AsSlice()), Mask: p.Mask}
	if !sub.Contains(net.IP(p.First.AsSlice())) || !sub.Contains(net.IP(p.Last.AsSlice())) {
		return fmt.Errorf("dhcp range %v-%v is not in the interface's subnet %v", p.First, p.Last, sub.String())
	}
	if c.Router.IsValid() && !c.Router.Is4() {
		return fmt.Errorf("dhcp router %v: want an IPv4 address", c.Router)
	}
	if c.DNS.IsValid() && !c.DNS.Is4() {
		return fmt.Errorf("dhcp dns %v: want an IPv4 address", c.DNS)
	}
	if c.LeaseTime <= 0 {
		c.LeaseTime = time.Hour
	}
	return nil
}

// Ignored is why a packet got no reply; the server logs it at debug level.
type Ignored struct{ Reason string }

func (i *Ignored) Error() string { return i.Reason }

func ignore(format string, args ...any) error { return &Ignored{fmt.Sprintf(format, args...)} }

// client is what a request says about its sender.
type client struct {
	mac  string
	pxe  bool // option 60 PXEClient or HTTPClient
	http bool // UEFI HTTP Boot
	ipxe bool // user class iPXE: our loader is running
	arch int  // option 93, -1 when absent
}

// maxPacket is the largest request considered: a DHCP message over
// Ethernet without fragmentation.
const maxPacket = 1500

// Respond is the reply to one packet, or an *Ignored error (or another
// error, from the lease store) and no reply.
func (h *Handler) Respond(ctx context.Context, pkt []byte) (*dhcpv4.DHCPv4, error) {
	if len(pkt) > maxPacket {
		return nil, ignore("oversized packet (%d bytes)", len(pkt))
	}
	req, err := dhcpv4.FromBytes(pkt)
	if err != nil {
		return nil, ignore("malformed packet: %v", err)
	}
	return h.respond(ctx, req)
}

func (h *Handler) respond(ctx context.Context, req *dhcpv4.DHCPv4) (*dhcpv4.DHCPv4, error) {
	if req.OpCode != dhcpv4.OpcodeBootRequest {
		return nil, ignore("not a request (op %d)", req.OpCode)
	}
	if req.HWType != iana.HWTypeEthernet || len(req.ClientHWAddr) != 6 {
		return nil, ignore("not an Ethernet client")
	}
	c, err := classify(req)
	if err != nil {
		return nil, err
	}
	if !h.flood.allow(c.mac, h.Now()) {
		return nil, ignore("%s: more than %d packets a second, ignored", c.mac, perMACPerSecond)
	}
	mt := req.MessageType()
	switch mt {
	case dhcpv4.MessageTypeDiscover, dhcpv4.MessageTypeRequest:
	case dhcpv4.MessageTypeRelease:
		if h.Config.Mode == Full && h.ours(req) {
			return nil, h.release(ctx, c.mac)
		}
		return nil, ignore("release")
	default:
		return nil, ignore("message type %s", mt)
	}
	if h.Config.Mode == Proxy {
		if !c.pxe {
			return nil, ignore("%s is not a PXE client (proxy mode)", c.mac)
		}
		boot, err := h.bootInfo(ctx, c)
		if err != nil {
			return nil, err
		}
		reply, err := h.reply(req, mt, boot)
		if err != nil {
			return nil, err
		}
		// Proxy DHCP: boot information only, the address comes from the
		// site's server.
		reply.YourIPAddr = net.IPv4zero
		return reply, nil
	}
	return h.full(ctx, req, mt, c)
}

func (h *Handler) full(ctx context.Context, req *dhcpv4.DHCPv4, mt dhcpv4.MessageType, c client) (*dhcpv4.DHCPv4, error) {
	now := h.Now()
	var boot []dhcpv4.Modifier
	if c.pxe {
		// A PXE client whose architecture has no loader gets no answer, as
		// in proxy mode and as the operator guide says: an address without
		// a boot file would only leave it retrying, holding a lease.
		var err error
		if boot, err = h.bootInfo(ctx, c); err != nil {
			return nil, err
		}
	}
	if mt == dhcpv4.MessageTypeRequest {
		if sid := req.ServerIdentifier(); sid != nil && !sid.Equal(net.IP(h.Config.ServerIP.AsSlice())) {
			return nil, ignore("%s chose server %v", c.mac, sid)
		}
		want := req.RequestedIPAddress()
		if want == nil || want.IsUnspecified() {
			want = req.ClientIPAddr
		}
		cur, ok, err := h.Leases.Current(ctx, c.mac, now)
		if err != nil {
			return nil, err
		}
		wantAddr, _ := netip.AddrFromSlice(want.To4())
		if !ok || cur != wantAddr {
			// Not our lease (another server's, or expired): say no, and the
			// client starts over with DISCOVER.
			return dhcpv4.NewReplyFromRequest(req, dhcpv4.WithMessageType(dhcpv4.MessageTypeNak),
				dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IP(h.Config.ServerIP.AsSlice()))))
		}
	}
	addr, err := h.Leases.Lease(ctx, c.mac, now, h.Config.LeaseTime)
	if errors.Is(err, ErrPoolExhausted) {
		return nil, ignore("%s: %v", c.mac, err)
	}
	if err != nil {
		return nil, fmt.Errorf("lease for %s: %w", c.mac, err)
	}
	mods := append(boot,
		dhcpv4.WithYourIP(net.IP(addr.AsSlice())),
		dhcpv4.WithNetmask(h.Config.Pool.Mask),
		dhcpv4.WithLeaseTime(uint32(h.Config.LeaseTime/time.Second)),
	)
	if h.Config.Router.IsValid() {
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptRouter(net.IP(h.Config.Router.AsSlice()))))
	}
	if h.Config.DNS.IsValid() {
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptDNS(net.IP(h.Config.DNS.AsSlice()))))
	}
	return h.reply(req, mt, mods)
}

func (h *Handler) release(ctx context.Context, mac string) error {
	if err := h.Leases.Release(ctx, mac); err != nil {
		return fmt.Errorf("release lease of %s: %w", mac, err)
	}
	return ignore("released the lease of %s", mac)
}

func (h *Handler) ours(req *dhcpv4.DHCPv4) bool {
	sid := req.ServerIdentifier()
	return sid != nil && sid.Equal(net.IP(h.Config.ServerIP.AsSlice()))
}

// reply builds an OFFER for a DISCOVER and an ACK for a REQUEST.
func (h *Handler) reply(req *dhcpv4.DHCPv4, mt dhcpv4.MessageType, mods []dhcpv4.Modifier) (*dhcpv4.DHCPv4, error) {
	typ := dhcpv4.MessageTypeOffer
	if mt == dhcpv4.MessageTypeRequest {
		typ = dhcpv4.MessageTypeAck
	}
	sip := net.IP(h.Config.ServerIP.AsSlice())
	all := append([]dhcpv4.Modifier{
		dhcpv4.WithMessageType(typ),
		dhcpv4.WithServerIP(sip),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(sip)),
		echoMachineID(req),
	}, mods...)
	r, err := dhcpv4.NewReplyFromRequest(req, all...)
	if err != nil {
		return nil, fmt.Errorf("build reply: %w", err)
	}
	return r, nil
}

// classify reads the client's identity, refusing what does not parse.
func classify(req *dhcpv4.DHCPv4) (client, error) {
	mac, err := macaddr.Normalize(macaddr.Format(req.ClientHWAddr))
	if err != nil {
		return client{}, ignore("client address: %v", err)
	}
	c := client{mac: mac, arch: -1}
	class := req.ClassIdentifier()
	c.pxe = strings.HasPrefix(class, "PXEClient") || strings.HasPrefix(class, "HTTPClient")
	c.http = strings.HasPrefix(class, "HTTPClient")
	// iPXE sends its user class as the plain string "iPXE" (not RFC 3004).
	if uc := req.Options.Get(dhcpv4.OptionUserClassInformation); uc != nil && bytes.Contains(uc, []byte("iPXE")) {
		c.ipxe = true
	}
	if raw := req.Options.Get(dhcpv4.OptionClientSystemArchitectureType); raw != nil {
		if len(raw) < 2 || len(raw)%2 != 0 {
			return client{}, ignore("%s: truncated client architecture option", mac)
		}
		c.arch = int(raw[0])<<8 | int(raw[1])
	}
	return c, nil
}

// Architectures (RFC 4578 and IANA's registry).
const (
	archBIOS       = 0
	archEFIBC      = 7
	archEFIx64     = 9
	archEFIx64HTTP = 16
)

// bootInfo is what a PXE client is told to load: iPXE gets the boot
// script's URL (loop breaking: anything else gets the iPXE binary and
// would chain iPXE forever), firmware gets the loader for its arch, and
// UEFI HTTP Boot of a machine whose template boots a signed image gets
// that image, with no iPXE in between.
func (h *Handler) bootInfo(ctx context.Context, c client) ([]dhcpv4.Modifier, error) {
	cfg := h.Config
	class := "PXEClient"
	var file string
	switch {
	case c.ipxe:
		file = cfg.HTTPBase + "/ipxe/boot?mac=" + c.mac
	case c.http || c.arch == archEFIx64HTTP:
		class = "HTTPClient"
		file = cfg.HTTPBase + "/loaders/" + LoaderUEFI
		if h.UKI != nil {
			uki, err := h.UKI.BootsUKI(ctx, c.mac)
			if err != nil {
				// No answer rather than the wrong one: the firmware asks again.
				return nil, fmt.Errorf("does %s boot a unified kernel image: %w", c.mac, err)
			}
			if uki {
				file = cfg.HTTPBase + "/uki/boot?mac=" + c.mac
			}
		}
	case c.arch == archBIOS:
		file = LoaderBIOS
	case c.arch == archEFIBC || c.arch == archEFIx64:
		file = cfg.UEFILoader
	case c.arch < 0:
		return nil, ignore("%s: PXE client without an architecture option", c.mac)
	default:
		return nil, ignore("%s: unsupported client architecture %d", c.mac, c.arch)
	}
	mods := []dhcpv4.Modifier{
		func(d *dhcpv4.DHCPv4) {
			d.BootFileName = file
			d.ServerHostName = cfg.ServerIP.String()
		},
		dhcpv4.WithOption(dhcpv4.OptClassIdentifier(class)),
	}
	if !c.ipxe {
		// PXE sub-option 6 (discovery control) = 8: boot from the file
		// name, skip boot-server discovery on port 4011.
		mods = append(mods, dhcpv4.WithGeneric(dhcpv4.OptionVendorSpecificInformation, []byte{6, 1, 8, 255}))
	}
	return mods, nil
}

// echoMachineID echoes option 97 (the client machine identifier), as PXE asks.
func echoMachineID(req *dhcpv4.DHCPv4) dhcpv4.Modifier {
	return dhcpv4.WithOptionCopied(req, dhcpv4.OptionClientMachineIdentifier)
}

// perMACPerSecond bounds what one client gets answered: a PXE client sends
// a handful of packets per boot, so more is a loop or a flood, and
// answering it would let one machine hold the store's write lock.
const perMACPerSecond = 20

// maxTracked bounds the flood guard's memory; past it, it starts over.
const maxTracked = 8192

type floodGuard struct {
	mu   sync.Mutex
	sec  time.Time
	seen map[string]int
}

func (f *floodGuard) allow(mac string, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	sec := now.Truncate(time.Second)
	if !sec.Equal(f.sec) || f.seen == nil || len(f.seen) >= maxTracked {
		f.sec, f.seen = sec, make(map[string]int)
	}
	f.seen[mac]++
	return f.seen[mac] <= perMACPerSecond
}
