package connlimit

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"
)

// At its source's cap a shedding listener closes that source's oldest
// unauthenticated connection and admits the new one: 128 silent
// connections from 127.0.0.1 no longer lock out the admin CLI beside them
// (issue 26). An authenticated connection is never shed.
func TestShedsTheOldestUnauthenticatedPerSource(t *testing.T) {
	f := start(t, Options{MaxPendingPerSource: 2, ShedPerSource: true})
	addr := f.l.Addr().String()
	authed := dialFrom(t, "127.0.0.2", addr)
	f.next(t).Authenticated()
	oldest := dialFrom(t, "127.0.0.2", addr)
	f.next(t)
	second := dialFrom(t, "127.0.0.2", addr)
	f.next(t)
	newest := dialFrom(t, "127.0.0.2", addr)
	f.next(t) // admitted, not refused
	if !closedByServer(oldest, 10*time.Second) {
		t.Fatal("the oldest unauthenticated connection was not shed")
	}
	for name, c := range map[string]net.Conn{"authenticated": authed, "second": second, "newest": newest} {
		if closedByServer(c, 50*time.Millisecond) {
			t.Fatalf("the %s connection was closed", name)
		}
	}
	if got := value(f.refused.WithLabelValues(ReasonShedSource)); got != 1 {
		t.Fatalf("shed{%s} = %v, want 1", ReasonShedSource, got)
	}
	if got := f.l.Stats(); got.Open != 3 || got.Pending["127.0.0.2"] != 2 {
		t.Fatalf("stats %+v, want 3 open, 2 pending", got)
	}
}

// At MaxConns a shedding listener closes the oldest unauthenticated
// connection of any source, and refuses only when every connection is
// authenticated.
func TestShedsAtTheTotalCapUntilOnlyAuthenticatedRemain(t *testing.T) {
	f := start(t, Options{MaxConns: 2, ShedMax: true})
	addr := f.l.Addr().String()
	a := dialFrom(t, "127.0.0.2", addr)
	f.next(t).Authenticated()
	b := dialFrom(t, "127.0.0.3", addr)
	f.next(t)
	c := dialFrom(t, "127.0.0.4", addr)
	f.next(t).Authenticated()
	if !closedByServer(b, 10*time.Second) {
		t.Fatal("the unauthenticated connection was not shed at the total cap")
	}
	if !closedByServer(dialFrom(t, "127.0.0.5", addr), 10*time.Second) {
		t.Fatal("a connection past the cap was held with only authenticated ones open")
	}
	for _, k := range []net.Conn{a, c} {
		if closedByServer(k, 50*time.Millisecond) {
			t.Fatal("an authenticated connection was closed")
		}
	}
	if got := value(f.refused.WithLabelValues(ReasonShedMax)); got != 1 {
		t.Fatalf("shed{%s} = %v, want 1", ReasonShedMax, got)
	}
	if got := value(f.refused.WithLabelValues(ReasonMaxConnections)); got != 1 {
		t.Fatalf("refused{%s} = %v, want 1", ReasonMaxConnections, got)
	}
}

// A connection still unauthenticated at its age limit is closed however
// busy it keeps itself; an authenticated one is not.
func TestUnauthenticatedConnectionsAge(t *testing.T) {
	f := start(t, Options{MaxUnauthenticatedAge: 30 * time.Second})
	addr := f.l.Addr().String()
	idle := dialFrom(t, "127.0.0.2", addr)
	f.next(t)
	agent := dialFrom(t, "127.0.0.2", addr)
	f.next(t).Authenticated()
	f.clk.Advance(29 * time.Second)
	if closedByServer(idle, 50*time.Millisecond) {
		t.Fatal("closed before its age limit")
	}
	f.clk.Advance(2 * time.Second)
	if !closedByServer(idle, 10*time.Second) {
		t.Fatal("an unauthenticated connection outlived its age limit")
	}
	if closedByServer(agent, 50*time.Millisecond) {
		t.Fatal("an authenticated connection was closed at the age limit")
	}
	if got := f.l.Stats(); got.Open != 1 || len(got.Pending) != 0 {
		t.Fatalf("stats %+v, want the agent alone", got)
	}
	if got := value(f.refused.WithLabelValues(ReasonUnauthenticatedAge)); got != 1 {
		t.Fatalf("closed{%s} = %v, want 1", ReasonUnauthenticatedAge, got)
	}
}

// Only a handshake with a certificate that verify accepts marks a
// connection authenticated: one without a certificate (Enrollment's) or
// with a self-signed one stays counted against its source.
func TestOnlyAVerifiedCertificateAuthenticates(t *testing.T) {
	good, bad := &x509.Certificate{Raw: []byte("good")}, &x509.Certificate{Raw: []byte("bad")}
	c := &creds{verify: func(c *x509.Certificate) bool { return c == good }}
	for _, tc := range []struct {
		name string
		info credentials.AuthInfo
		want bool
	}{
		{"no certificate", credentials.TLSInfo{}, false},
		{"verified", credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{good}}}, true},
		{"not the CA's", credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{bad}}}, false},
		{"not TLS", nil, false},
	} {
		if got := c.certified(tc.info); got != tc.want {
			t.Errorf("%s: certified %v, want %v", tc.name, got, tc.want)
		}
	}
}
