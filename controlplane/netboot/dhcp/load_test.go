package dhcp

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"
	"github.com/insomniacslk/dhcp/iana"

	"github.com/tetherfleet/tether/internal/testkit/netnstest"
)

// BenchmarkPXEClients is the responder's load measurement: each iteration
// is 1,000 simulated PXE clients (distinct MACs) sending a DISCOVER over a
// veth pair inside a test-owned namespace, with 1 or 32 waiting at a time
// (one machine after another, or a rack powered on at once), and it
// reports answers per second and the p50/p99 time to the OFFER.
//
//	go test -tags nobadger,nobbolt,nomysql -run XXX -bench PXEClients -benchtime 3x ./controlplane/netboot/dhcp/
func BenchmarkPXEClients(b *testing.B) {
	for _, bc := range []struct {
		mode   Mode
		window int
	}{{Proxy, 1}, {Proxy, 32}, {Full, 1}, {Full, 32}} {
		mode, window := bc.mode, bc.window
		b.Run(fmt.Sprintf("%s/window=%d", mode, window), func(b *testing.B) {
			const clients = 1000
			var lat []time.Duration
			var elapsed time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				ns := netnstest.New(b, "10.213.0.1/16")
				ns.AddClientAddr(b, "10.213.255.254/16")
				h := newHandler(b, mode)
				h.Now = time.Now
				if mode == Full {
					h.Config.Pool.Last = h.Config.Pool.First.Next().Next()
					for range clients {
						h.Config.Pool.Last = h.Config.Pool.Last.Next()
					}
					h.Config.Pool.Mask = net.CIDRMask(16, 32)
					h.Leases.(*StoreLeases).Pool = h.Config.Pool
				}
				srv := &Server{Interface: ns.Server, Handler: h, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
				var sconn, cconn net.PacketConn
				err := ns.Do(func() error {
					var err error
					sconn, err = srv.Listen()
					return err
				})
				if err == nil {
					err = ns.DoClient(func() error {
						var err error
						cconn, err = server4.NewIPv4UDPConn(ns.Client, &net.UDPAddr{Port: dhcpv4.ClientPort})
						return err
					})
				}
				if err != nil {
					b.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- srv.ServeConn(ctx, sconn) }()
				b.StartTimer()
				d, l := runClients(b, cconn, clients, window)
				b.StopTimer()
				elapsed += d
				lat = append(lat, l...)
				cconn.Close()
				cancel()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
			}
			slices.Sort(lat)
			b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "answers/s")
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// runClients sends n DISCOVERs, keeping at most window unanswered, and
// returns the wall time and each client's time to its OFFER.
func runClients(b *testing.B, conn net.PacketConn, n, window int) (time.Duration, []time.Duration) {
	dst := &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ServerPort}
	sent := make([]time.Time, n)
	lat := make([]time.Duration, 0, n)
	answered := make(chan int, n)
	go func() {
		buf := make([]byte, 1500)
		for {
			_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			k, _, err := conn.ReadFrom(buf)
			if err != nil {
				close(answered)
				return
			}
			m, err := dhcpv4.FromBytes(buf[:k])
			if err != nil || m.MessageType() != dhcpv4.MessageTypeOffer {
				continue
			}
			id := int(m.TransactionID[2])<<8 | int(m.TransactionID[3])
			if id < n {
				answered <- id
			}
		}
	}()
	start := time.Now()
	inflight := 0
	got := 0
	for i := 0; i < n || inflight > 0; {
		if i < n && inflight < window {
			mac := net.HardwareAddr{0x52, 0x54, 0x01, 0, byte(i >> 8), byte(i)}
			d, err := dhcpv4.NewDiscovery(mac, append(pxe(iana.INTEL_X86PC, "PXEClient:Arch:00000:UNDI:002001"),
				dhcpv4.WithTransactionID(dhcpv4.TransactionID{0x7e, 0x7e, byte(i >> 8), byte(i)}))...)
			if err != nil {
				b.Fatal(err)
			}
			sent[i] = time.Now()
			if _, err := conn.WriteTo(d.ToBytes(), dst); err != nil {
				b.Fatal(err)
			}
			i++
			inflight++
			continue
		}
		id, ok := <-answered
		if !ok {
			b.Fatalf("%d of %d clients answered before a 5 s silence", got, n)
		}
		lat = append(lat, time.Since(sent[id]))
		inflight--
		got++
	}
	return time.Since(start), lat
}
