package api_test

import (
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// http2Hello is a client's connection preface and an empty SETTINGS frame:
// after it the server's HTTP/2 handshake is done.
const http2Hello = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + "\x00\x00\x00\x04\x00\x00\x00\x00\x00"

// certless opens a connection from src that finishes TLS (no client
// certificate, as Enrollment allows) and the HTTP/2 preface, then idles.
func certless(t *testing.T, cp *testcp.ControlPlane, src string) *tls.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	cfg := cp.TLS(nil)
	cfg.NextProtos = []string{"h2"}
	c, err := tls.DialWithDialer(&d, "tcp", cp.Addr, cfg)
	if err != nil {
		t.Fatalf("TLS from %s: %v", src, err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, http2Hello); err != nil {
		t.Fatal(err)
	}
	// The server's SETTINGS: its side of the handshake is done too.
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, make([]byte, 9)); err != nil {
		t.Fatalf("no HTTP/2 SETTINGS from the server: %v", err)
	}
	return c
}

// serverClosed drains c until the server closes it (true) or within
// passes (false).
func serverClosed(c net.Conn, within time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(within))
	_, err := io.Copy(io.Discard, c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return false
	}
	return true
}

// Issue 26: connections that finished TLS and HTTP/2 without a
// certificate left the per-source count and were never closed. Now they
// stay in it (past the cap the oldest is shed for the new one, and the
// admin CLI from the same address gets in), and each is closed at its age
// limit, however quiet.
func TestCertificateLessConnectionsStayCountedAndAge(t *testing.T) {
	const perSource = 4
	const age = 2 * time.Second
	cp := testcp.Start(t, testcp.With(func(o *daemon.ServeOptions) {
		o.Limits.MaxUnauthenticatedPerSource = perSource
		o.Limits.UnauthenticatedAge = age
	}))
	ctx := ctxT(t)
	var conns []*tls.Conn
	for range 2 * perSource {
		conns = append(conns, certless(t, cp, "127.0.0.1"))
	}
	for i, c := range conns[:perSource] {
		if !serverClosed(c, age/2) {
			t.Fatalf("certificate-less connection %d of %d still open past the per-source cap %d", i, 2*perSource, perSource)
		}
	}
	// A new admin connection from the flooded address is admitted and,
	// once its certificate is verified, no longer counted.
	admin := v1.NewAdminServiceClient(cp.Dial(&cp.AdminCert))
	if _, err := admin.ListNodes(ctx, &v1.ListNodesRequest{}); err != nil {
		t.Fatalf("the admin CLI beside the flood: %v", err)
	}
	start := time.Now()
	for i, c := range conns[perSource:] {
		if !serverClosed(c, 3*age) {
			t.Fatalf("certificate-less connection %d still open %v after its age limit of %v", perSource+i, time.Since(start), age)
		}
	}
	if _, err := admin.ListNodes(ctx, &v1.ListNodesRequest{}); err != nil {
		t.Fatalf("the admin connection was closed with the certificate-less ones: %v", err)
	}
}
