package ca_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"net"
	"testing"

	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/pki/ca"
)

// BenchmarkHandshake is the CPU of one TLS 1.3 handshake as an enrolling
// node makes it (no client certificate, the CA pinned), both ends in this
// process, for each pairing of CA key and server key. A new connection
// per enrollment pays this on top of the enrollment itself.
func BenchmarkHandshake(b *testing.B) {
	for _, tc := range []struct {
		name   string
		caKey  ca.KeyType
		server func() crypto.Signer
	}{
		{"ca=p256/server=p256", ca.KeyP256, func() crypto.Signer { k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader); return k }},
		{"ca=ed25519/server=p256", ca.KeyEd25519, func() crypto.Signer { k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader); return k }},
		{"ca=ed25519/server=ed25519", ca.KeyEd25519, func() crypto.Signer { _, k, _ := ed25519.GenerateKey(rand.Reader); return k }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c, err := ca.CreateWithKey(b.TempDir(), "bench", clock.Real{}, tc.caKey)
			if err != nil {
				b.Fatal(err)
			}
			key := tc.server()
			crt, err := c.SignServer([]string{"127.0.0.1"}, key.Public())
			if err != nil {
				b.Fatal(err)
			}
			srvCfg := &tls.Config{MinVersion: tls.VersionTLS13, ClientAuth: tls.RequestClientCert,
				Certificates: []tls.Certificate{{Certificate: [][]byte{crt.Raw, c.Certificate().Raw}, PrivateKey: key, Leaf: crt}}}
			cliCfg := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: c.Pool(), ServerName: "127.0.0.1"}
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuTime()
			for i := 0; i < b.N; i++ {
				a, z := net.Pipe()
				srv := tls.Server(a, srvCfg)
				done := make(chan error, 1)
				go func() { done <- srv.Handshake() }()
				cli := tls.Client(z, cliCfg)
				if err := cli.Handshake(); err != nil {
					b.Fatal(err)
				}
				if err := <-done; err != nil {
					b.Fatal(err)
				}
				// Close the pipe, not the TLS conns: a close_notify would
				// block on a synchronous pipe nobody reads.
				a.Close()
				z.Close()
			}
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}
