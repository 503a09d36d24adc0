package dhcp

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
)

// memLeases is Leases in memory: the fuzz target exercises the handler,
// not SQLite.
type memLeases struct {
	mu   sync.Mutex
	pool Pool
	by   map[string]netip.Addr
}

func (m *memLeases) Lease(_ context.Context, mac string, _ time.Time, _ time.Duration) (netip.Addr, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if a, ok := m.by[mac]; ok {
		return a, nil
	}
	for a := m.pool.First; a.Compare(m.pool.Last) <= 0; a = a.Next() {
		free := true
		for _, b := range m.by {
			free = free && a != b
		}
		if free {
			m.by[mac] = a
			return a, nil
		}
	}
	return netip.Addr{}, ErrPoolExhausted
}

func (m *memLeases) Current(_ context.Context, mac string, _ time.Time) (netip.Addr, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a, ok := m.by[mac]
	return a, ok, nil
}

func (m *memLeases) Release(_ context.Context, mac string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.by, mac)
	return nil
}

// FuzzDHCPRespond sends fuzzed packets through Handler.Respond, the entry
// point of every packet the server reads, in proxy and in full mode (it
// replaces FuzzRespond, which had no corpus, with the pool, transaction
// and client checks and an in-memory lease table).
// Whatever arrives: no panic; a reply or an error, never both; a reply is
// a BOOTREPLY to the client that asked, no larger than a request may be,
// offering (in full mode) only addresses of the pool and (in proxy mode)
// none.
func FuzzDHCPRespond(f *testing.F) {
	for _, mods := range [][]dhcpv4.Modifier{
		nil,
		pxe(iana.INTEL_X86PC, "PXEClient"),
		pxe(iana.EFI_X86_64, "PXEClient"),
		pxe(iana.Arch(16), "HTTPClient"),
		pxe(iana.Arch(0x1234), "PXEClient"),
		pxe(iana.INTEL_X86PC, "PXEClient", dhcpv4.WithUserClass("iPXE", false)),
		{dhcpv4.WithGeneric(dhcpv4.OptionClientSystemArchitectureType, []byte{0})},
	} {
		d, err := dhcpv4.NewDiscovery(hw, mods...)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(d.ToBytes(), false)
		f.Add(d.ToBytes(), true)
	}
	f.Add([]byte{}, true)
	f.Add([]byte{1, 1, 6, 0}, false)
	handlers := map[bool]*Handler{false: newHandler(f, Proxy), true: newHandler(f, Full)}
	full := handlers[true]
	full.Leases = &memLeases{pool: full.Config.Pool, by: map[string]netip.Addr{}}
	// Each input is its own second, so the per-MAC flood guard does not
	// turn most inputs into "ignored".
	var tick int64
	for _, h := range handlers {
		h.Now = func() time.Time { tick++; return t0.Add(time.Duration(tick) * time.Second) }
	}
	f.Fuzz(func(t *testing.T, pkt []byte, fullMode bool) {
		h := handlers[fullMode]
		reply, err := h.Respond(context.Background(), pkt)
		if (reply == nil) == (err == nil) {
			t.Fatalf("reply %v and error %v", reply, err)
		}
		if reply == nil {
			return
		}
		req, perr := dhcpv4.FromBytes(pkt)
		if perr != nil {
			t.Fatalf("answered a packet that does not parse (%v)", perr)
		}
		if reply.OpCode != dhcpv4.OpcodeBootReply || reply.TransactionID != req.TransactionID ||
			net.HardwareAddr(reply.ClientHWAddr).String() != net.HardwareAddr(req.ClientHWAddr).String() {
			t.Fatalf("reply is not a BOOTREPLY to the asking client: %s", reply.Summary())
		}
		if n := len(reply.ToBytes()); n > maxPacket {
			t.Fatalf("a %d-byte reply", n)
		}
		yi, _ := netip.AddrFromSlice(reply.YourIPAddr.To4())
		switch {
		case reply.MessageType() == dhcpv4.MessageTypeNak:
		case !fullMode && reply.YourIPAddr != nil && !reply.YourIPAddr.IsUnspecified():
			t.Fatalf("proxy mode offered %v", reply.YourIPAddr)
		case fullMode && !h.Config.Pool.Contains(yi):
			t.Fatalf("full mode offered %v, outside the pool", reply.YourIPAddr)
		}
	})
}
