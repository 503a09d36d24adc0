package dhcp

import (
	"context"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"

	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/internal/macaddr"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

const http0 = "http://10.213.0.1:8080"

func newHandler(t testing.TB, mode Mode) *Handler {
	t.Helper()
	cfg := Config{Mode: mode, ServerIP: netip.MustParseAddr("10.213.0.1"), HTTPBase: http0}
	h := &Handler{Now: func() time.Time { return t0 }}
	if mode == Full {
		cfg.Pool = Pool{First: netip.MustParseAddr("10.213.0.100"), Last: netip.MustParseAddr("10.213.0.102"), Mask: net.CIDRMask(24, 32)}
		cfg.Router = netip.MustParseAddr("10.213.0.1")
		cfg.DNS = netip.MustParseAddr("10.213.0.53")
		st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "t.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		h.Leases = &StoreLeases{Store: st, Pool: cfg.Pool}
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	h.Config = cfg
	return h
}

var hw = net.HardwareAddr{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}

func pxe(arch iana.Arch, class string, mods ...dhcpv4.Modifier) []dhcpv4.Modifier {
	return append([]dhcpv4.Modifier{
		dhcpv4.WithOption(dhcpv4.OptClassIdentifier(class)),
		dhcpv4.WithOption(dhcpv4.OptClientArch(arch)),
		dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}),
	}, mods...)
}

func discover(t testing.TB, mods ...dhcpv4.Modifier) []byte {
	t.Helper()
	d, err := dhcpv4.NewDiscovery(hw, mods...)
	if err != nil {
		t.Fatal(err)
	}
	return d.ToBytes()
}

func TestProxyBootFileByClient(t *testing.T) {
	h := newHandler(t, Proxy)
	ipxe := dhcpv4.WithGeneric(dhcpv4.OptionUserClassInformation, []byte("iPXE"))
	tests := []struct {
		name      string
		mods      []dhcpv4.Modifier
		file      string
		class     string
		discovery bool // option 43 sub-option 6 = 8
	}{
		{"BIOS PXE", pxe(iana.INTEL_X86PC, "PXEClient:Arch:00000:UNDI:002001"), "undionly.kpxe", "PXEClient", true},
		{"UEFI x86-64", pxe(iana.EFI_X86_64, "PXEClient:Arch:00007:UNDI:003016"), "ipxe.efi", "PXEClient", true},
		{"UEFI BC", pxe(iana.EFI_BC, "PXEClient:Arch:00007:UNDI:003016"), "ipxe.efi", "PXEClient", true},
		{"UEFI HTTP Boot", pxe(iana.EFI_X86_64_HTTP, "HTTPClient:Arch:00016:UNDI:003016"), http0 + "/loaders/ipxe.efi", "HTTPClient", true},
		{"iPXE", pxe(iana.INTEL_X86PC, "PXEClient:Arch:00000:UNDI:002001", ipxe), http0 + "/ipxe/boot?mac=52:54:00:12:34:56", "PXEClient", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := h.Respond(context.Background(), discover(t, tc.mods...))
			if err != nil {
				t.Fatal(err)
			}
			if r.MessageType() != dhcpv4.MessageTypeOffer || r.OpCode != dhcpv4.OpcodeBootReply {
				t.Fatalf("reply type %s", r.MessageType())
			}
			if r.BootFileName != tc.file || r.ClassIdentifier() != tc.class {
				t.Fatalf("boot file %q class %q, want %q %q", r.BootFileName, r.ClassIdentifier(), tc.file, tc.class)
			}
			if !r.YourIPAddr.IsUnspecified() {
				t.Fatalf("proxy DHCP offered an address: %v", r.YourIPAddr)
			}
			if !r.ServerIPAddr.Equal(net.ParseIP("10.213.0.1")) || !r.ServerIdentifier().Equal(net.ParseIP("10.213.0.1")) || r.ServerHostName != "10.213.0.1" {
				t.Fatalf("next server: siaddr %v option 54 %v sname %q", r.ServerIPAddr, r.ServerIdentifier(), r.ServerHostName)
			}
			if got := r.GetOneOption(dhcpv4.OptionClientMachineIdentifier); len(got) != 17 {
				t.Fatalf("option 97 not echoed: %x", got)
			}
			o43 := r.GetOneOption(dhcpv4.OptionVendorSpecificInformation)
			if tc.discovery != (string(o43) == "\x06\x01\x08\xff") {
				t.Fatalf("option 43 = %x", o43)
			}
		})
	}
}

func TestProxyIgnores(t *testing.T) {
	h := newHandler(t, Proxy)
	req := func(mt dhcpv4.MessageType, mods ...dhcpv4.Modifier) []byte {
		d, err := dhcpv4.New(append([]dhcpv4.Modifier{dhcpv4.WithHwAddr(hw), dhcpv4.WithMessageType(mt)}, mods...)...)
		if err != nil {
			t.Fatal(err)
		}
		return d.ToBytes()
	}
	reply, _ := dhcpv4.NewReplyFromRequest(mustParse(t, discover(t, pxe(iana.INTEL_X86PC, "PXEClient")...)))
	long := discover(t, pxe(iana.INTEL_X86PC, "PXEClient")...)
	long = append(long, make([]byte, 2000)...)
	truncArch := discover(t, dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient")), dhcpv4.WithGeneric(dhcpv4.OptionClientSystemArchitectureType, []byte{0}))
	tests := []struct {
		name string
		pkt  []byte
		why  string
	}{
		{"not PXE", discover(t), "not a PXE client"},
		{"no arch", discover(t, dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient"))), "without an architecture"},
		{"unknown arch", discover(t, pxe(iana.Arch(0x1234), "PXEClient")...), "unsupported client architecture 4660"},
		{"truncated arch", truncArch, "truncated client architecture"},
		{"a reply", reply.ToBytes(), "not a request"},
		{"inform", req(dhcpv4.MessageTypeInform, pxe(iana.INTEL_X86PC, "PXEClient")...), "message type INFORM"},
		{"empty", nil, "malformed"},
		{"truncated", discover(t)[:100], "malformed"},
		{"oversized", long, "oversized"},
		{"not Ethernet", req(dhcpv4.MessageTypeDiscover, dhcpv4.WithHWType(iana.HWTypeInfiniband)), "not an Ethernet client"},
		{"multicast client", func() []byte {
			d, _ := dhcpv4.NewDiscovery(net.HardwareAddr{1, 0, 0x5e, 0, 0, 1}, pxe(iana.INTEL_X86PC, "PXEClient")...)
			return d.ToBytes()
		}(), "client address"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := h.Respond(context.Background(), tc.pkt)
			var ig *Ignored
			if r != nil || !asIgnored(err, &ig) || !strings.Contains(ig.Reason, tc.why) {
				t.Fatalf("reply %v, err %v; want ignored for %q", r, err, tc.why)
			}
		})
	}
}

func TestFloodFromOneMACIsIgnored(t *testing.T) {
	h := newHandler(t, Proxy)
	pkt := discover(t, pxe(iana.INTEL_X86PC, "PXEClient")...)
	answered := 0
	for range 100 {
		if r, _ := h.Respond(context.Background(), pkt); r != nil {
			answered++
		}
	}
	if answered != perMACPerSecond {
		t.Fatalf("answered %d of 100 packets in one second, want %d", answered, perMACPerSecond)
	}
	// Another machine is not starved by the flood.
	other, _ := dhcpv4.NewDiscovery(net.HardwareAddr{0x52, 0x54, 0, 0, 0, 9}, pxe(iana.INTEL_X86PC, "PXEClient")...)
	if r, err := h.Respond(context.Background(), other.ToBytes()); r == nil {
		t.Fatalf("another machine got no answer during the flood: %v", err)
	}
}

func TestFullLeasesAndRenews(t *testing.T) {
	h := newHandler(t, Full)
	ctx := context.Background()
	offer, err := h.Respond(ctx, discover(t, pxe(iana.INTEL_X86PC, "PXEClient")...))
	if err != nil {
		t.Fatal(err)
	}
	if !offer.YourIPAddr.Equal(net.ParseIP("10.213.0.100")) || offer.BootFileName != "undionly.kpxe" ||
		offer.SubnetMask().String() != "ffffff00" || !offer.Router()[0].Equal(net.ParseIP("10.213.0.1")) || !offer.DNS()[0].Equal(net.ParseIP("10.213.0.53")) {
		t.Fatalf("offer: %s", offer.Summary())
	}
	reqMsg, err := dhcpv4.NewRequestFromOffer(offer)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := h.Respond(ctx, reqMsg.ToBytes())
	if err != nil || ack.MessageType() != dhcpv4.MessageTypeAck || !ack.YourIPAddr.Equal(offer.YourIPAddr) {
		t.Fatalf("ack: %v %v", ack, err)
	}
	// The same machine again gets the same address; a non-PXE machine gets
	// an address and no boot file.
	again, _ := h.Respond(ctx, discover(t))
	if !again.YourIPAddr.Equal(offer.YourIPAddr) || again.BootFileName != "" {
		t.Fatalf("same machine again: %s", again.Summary())
	}
	// A REQUEST for an address that is not the machine's lease gets a NAK.
	bad, _ := dhcpv4.NewRequestFromOffer(offer, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.ParseIP("10.213.0.101"))))
	nak, err := h.Respond(ctx, bad.ToBytes())
	if err != nil || nak.MessageType() != dhcpv4.MessageTypeNak {
		t.Fatalf("request for another address: %v %v", nak, err)
	}
	// A REQUEST to another server is none of our business.
	other, _ := dhcpv4.NewRequestFromOffer(offer, dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.ParseIP("10.213.0.2"))))
	if r, _ := h.Respond(ctx, other.ToBytes()); r != nil {
		t.Fatalf("answered a request to another server: %s", r.Summary())
	}
}

func TestFullPoolExhaustionAndReuse(t *testing.T) {
	h := newHandler(t, Full)
	ctx := context.Background()
	seen := map[string]bool{}
	for i := range 4 {
		d, _ := dhcpv4.NewDiscovery(net.HardwareAddr{0x52, 0x54, 0, 0, 1, byte(i)})
		r, err := h.Respond(ctx, d.ToBytes())
		if i == 3 {
			var ig *Ignored
			if r != nil || !asIgnored(err, &ig) || !strings.Contains(ig.Reason, "no free address") {
				t.Fatalf("fourth machine in a pool of three: %v %v", r, err)
			}
			continue
		}
		if err != nil || seen[r.YourIPAddr.String()] {
			t.Fatalf("machine %d: %v, address %v leased twice: %v", i, err, r.YourIPAddr, seen)
		}
		seen[r.YourIPAddr.String()] = true
	}
	// Once the leases ran out, a new machine gets an address again.
	h.Now = func() time.Time { return t0.Add(2 * time.Hour) }
	d, _ := dhcpv4.NewDiscovery(net.HardwareAddr{0x52, 0x54, 0, 0, 1, 9})
	if r, err := h.Respond(ctx, d.ToBytes()); err != nil || !seen[r.YourIPAddr.String()] {
		t.Fatalf("after expiry: %v %v", r, err)
	}
}

func TestValidate(t *testing.T) {
	ip := netip.MustParseAddr
	mask := net.CIDRMask(24, 32)
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"mode", Config{Mode: "both", ServerIP: ip("10.0.0.1"), HTTPBase: http0}, "want proxy or full"},
		{"proxy with range", Config{Mode: Proxy, ServerIP: ip("10.0.0.1"), HTTPBase: http0, Pool: Pool{First: ip("10.0.0.5"), Last: ip("10.0.0.9")}}, "need --dhcp-mode full"},
		{"full without range", Config{Mode: Full, ServerIP: ip("10.0.0.1"), HTTPBase: http0}, "want FIRST-LAST"},
		{"reversed", Config{Mode: Full, ServerIP: ip("10.0.0.1"), HTTPBase: http0, Pool: Pool{First: ip("10.0.0.9"), Last: ip("10.0.0.5"), Mask: mask}}, "in order"},
		{"own address", Config{Mode: Full, ServerIP: ip("10.0.0.6"), HTTPBase: http0, Pool: Pool{First: ip("10.0.0.5"), Last: ip("10.0.0.9"), Mask: mask}}, "own address"},
		{"other subnet", Config{Mode: Full, ServerIP: ip("10.0.0.1"), HTTPBase: http0, Pool: Pool{First: ip("10.0.1.5"), Last: ip("10.0.1.9"), Mask: mask}}, "not in the interface's subnet"},
		{"https", Config{Mode: Proxy, ServerIP: ip("10.0.0.1"), HTTPBase: "https://x"}, "http:// URL"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want %q", err, tc.want)
			}
		})
	}
}

func mustParse(t *testing.T, b []byte) *dhcpv4.DHCPv4 {
	t.Helper()
	d, err := dhcpv4.FromBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func asIgnored(err error, ig **Ignored) bool {
	i, ok := err.(*Ignored)
	*ig = i
	return ok
}

// TestReplicasNeverLeaseAnAddressTwice: two lease keepers over one store
// (two replicas, each with its own hint) leasing at once.
func TestReplicasNeverLeaseAnAddressTwice(t *testing.T) {
	h := newHandler(t, Full)
	st := h.Leases.(*StoreLeases).Store
	pool := Pool{First: netip.MustParseAddr("10.213.0.100"), Last: netip.MustParseAddr("10.213.0.139"), Mask: net.CIDRMask(24, 32)}
	replicas := []*StoreLeases{{Store: st, Pool: pool}, {Store: st, Pool: pool}}
	type got struct {
		mac  string
		addr netip.Addr
		err  error
	}
	out := make(chan got, 40)
	for i := range 40 {
		go func() {
			mac := macaddrOf(i)
			a, err := replicas[i%2].Lease(context.Background(), mac, t0, time.Hour)
			out <- got{mac, a, err}
		}()
	}
	seen := map[netip.Addr]string{}
	for range 40 {
		g := <-out
		if g.err != nil {
			t.Fatalf("%s: %v", g.mac, g.err)
		}
		if other, dup := seen[g.addr]; dup {
			t.Fatalf("%v leased to %s and %s", g.addr, other, g.mac)
		}
		seen[g.addr] = g.mac
	}
}

func macaddrOf(i int) string {
	return net.HardwareAddr{0x52, 0x54, 0, 0, 2, byte(i)}.String()
}

// Full mode answers a PXE client of an unknown architecture with nothing,
// as proxy mode does and the operator guide says (issue 26: it offered an
// address), and leases it nothing.
func TestFullIgnoresUnknownArchitectures(t *testing.T) {
	h := newHandler(t, Full)
	for _, pkt := range [][]byte{
		discover(t, pxe(iana.Arch(0x1234), "PXEClient")...),
		discover(t, dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient"))),
	} {
		r, err := h.Respond(context.Background(), pkt)
		var ig *Ignored
		if r != nil || !asIgnored(err, &ig) {
			t.Fatalf("reply %v, err %v; want no answer", r, err)
		}
	}
	if _, ok, err := h.Leases.Current(context.Background(), macaddr.Format(hw), t0); err != nil || ok {
		t.Fatalf("a lease was recorded for the unanswered client (%v, %v)", ok, err)
	}
	// A machine that is not a PXE client still gets its address.
	if r, err := h.Respond(context.Background(), discover(t)); r == nil {
		t.Fatalf("a plain DHCP client got no offer: %v", err)
	}
}
