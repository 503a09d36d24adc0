package dhcp

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/insomniacslk/dhcp/iana"

	"github.com/tetherfleet/tether/internal/testkit/netnstest"
)

// serveInNS runs h on the namespace's server end and returns a DHCP
// client on its client end.
func serveInNS(t *testing.T, ns *netnstest.NS, h *Handler) *nclient4.Client {
	t.Helper()
	srv := &Server{Interface: ns.Server, Handler: h, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	var conn net.PacketConn
	var client *nclient4.Client
	err := ns.Do(func() error {
		var err error
		conn, err = srv.Listen()
		return err
	})
	if err == nil {
		err = ns.DoClient(func() error {
			var err error
			client, err = nclient4.New(ns.Client, nclient4.WithTimeout(2*time.Second), nclient4.WithRetry(3))
			return err
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.ServeConn(ctx, conn) }()
	t.Cleanup(func() {
		client.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ServeConn: %v", err)
		}
	})
	return client
}

func TestRealExchangeInANamespace(t *testing.T) {
	for _, mode := range []Mode{Proxy, Full} {
		t.Run(string(mode), func(t *testing.T) {
			ns := netnstest.New(t, "10.213.0.1/24")
			h := newHandler(t, mode)
			h.Now = time.Now // leases are checked against real time by the real client's exchange
			client := serveInNS(t, ns, h)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			lease, err := client.Request(ctx, pxe(iana.INTEL_X86PC, "PXEClient:Arch:00000:UNDI:002001")...)
			if err != nil {
				t.Fatalf("DHCP exchange: %v", err)
			}
			ack := lease.ACK
			if ack.MessageType() != dhcpv4.MessageTypeAck || ack.BootFileName != LoaderBIOS || !ack.ServerIPAddr.Equal(net.ParseIP("10.213.0.1")) {
				t.Fatalf("ack: %s", ack.Summary())
			}
			switch mode {
			case Proxy:
				if !ack.YourIPAddr.IsUnspecified() {
					t.Fatalf("proxy mode leased %v", ack.YourIPAddr)
				}
			case Full:
				if !ack.YourIPAddr.Equal(net.ParseIP("10.213.0.100")) {
					t.Fatalf("full mode leased %v, want 10.213.0.100", ack.YourIPAddr)
				}
			}
			// iPXE, once running, is sent to the boot route with its address.
			offer, err := client.DiscoverOffer(ctx, pxe(iana.INTEL_X86PC, "PXEClient", dhcpv4.WithGeneric(dhcpv4.OptionUserClassInformation, []byte("iPXE")))...)
			if err != nil {
				t.Fatal(err)
			}
			if want := http0 + "/ipxe/boot?mac=" + client.InterfaceAddr().String(); offer.BootFileName != want {
				t.Fatalf("iPXE boot file %q, want %q", offer.BootFileName, want)
			}
		})
	}
}
