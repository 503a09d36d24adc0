package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	agentenroll "github.com/tetherfleet/tether/agent/enroll"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
)

func TestFleetEndpoints(t *testing.T) {
	for _, tc := range []struct {
		raw     string
		targets []string
		err     string
	}{
		{raw: "", targets: nil},
		{raw: "https://127.0.0.1:18443", targets: []string{"127.0.0.1:18443"}},
		{raw: "https://127.0.0.1:18443, https://127.0.0.1:18445", targets: []string{"127.0.0.1:18443", "127.0.0.1:18445"}},
		{raw: "https://127.0.0.1:18443,127.0.0.1:18445", err: `"127.0.0.1:18445"`},
	} {
		eps, err := fleetEndpoints(tc.raw)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want one naming %s", tc.raw, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%q: %v", tc.raw, err)
		}
		var got []string
		for _, e := range eps {
			got = append(got, e.Target)
			if e.Host != "127.0.0.1" {
				t.Errorf("%q: host %q, want the URL's", tc.raw, e.Host)
			}
		}
		if strings.Join(got, ",") != strings.Join(tc.targets, ",") {
			t.Errorf("%q: targets %v, want %v", tc.raw, got, tc.targets)
		}
	}
}

// An agent keeps one failover dialer for the fleet's life, so the replica
// it moved to is where its next connection starts.
func TestAgentFailoversOnePerAgent(t *testing.T) {
	eps, err := fleetEndpoints("https://127.0.0.1:1,https://127.0.0.1:2")
	if err != nil {
		t.Fatal(err)
	}
	var fs agentFailovers
	var a, b tls.Certificate
	d := &net.Dialer{}
	if fs.of(&a, eps, d) != fs.of(&a, eps, d) {
		t.Error("one agent got two failover dialers")
	}
	if fs.of(&a, eps, d) == fs.of(&b, eps, d) {
		t.Error("two agents share a failover dialer")
	}
}

// A replica at its connection cap accepts and closes at once. An agent
// refused that way moves on to the next control plane, as the real agent
// does, rather than dialling the full one again (which stranded 1,129
// agents of a 100,000-agent run).
func TestAgentMovesPastAReplicaThatClosesAtOnce(t *testing.T) {
	cp := testcp.Start(t)
	full, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer full.Close()
	go func() {
		for {
			c, err := full.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	eps, err := fleetEndpoints("https://" + full.Addr().String() + ",https://" + cp.Addr)
	if err != nil {
		t.Fatal(err)
	}
	dial, err := agentDialer(cp.CA, "127.0.0.1", full.Addr().String(), eps)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cert := selfSigned(t)
	check := func() error {
		conn, err := dial(nil, &cert)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	if err := check(); err == nil {
		t.Fatal("the first attempt reached a control plane; it should have met the full one")
	}
	if err := check(); err != nil {
		t.Fatalf("the second attempt did not move past the full control plane: %v", err)
	}
}

// selfSigned is a client certificate no one issued: enough for a TLS
// handshake and the health service.
func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, pub, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func TestAgentTargetTakesALoneEndpoint(t *testing.T) {
	one, err := fleetEndpoints("https://127.0.0.2:18502")
	if err != nil {
		t.Fatal(err)
	}
	two, err := fleetEndpoints("https://127.0.0.2:18502,https://127.0.0.3:18503")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name             string
		eps              []agentenroll.Endpoint
		target, wantHost string
	}{
		{"no --endpoints: the config's", nil, "127.0.0.1:18501", "127.0.0.1"},
		{"one: that one", one, "127.0.0.2:18502", "127.0.0.2"},
		{"several: the failover dialer walks them from the config's", two, "127.0.0.1:18501", "127.0.0.1"},
	} {
		target, host := agentTarget("127.0.0.1:18501", "127.0.0.1", tc.eps)
		if target != tc.target || host != tc.wantHost {
			t.Errorf("%s: %s (host %s), want %s (host %s)", tc.name, target, host, tc.target, tc.wantHost)
		}
	}
}
