package main

import (
	"crypto/tls"
	"net"
	"strings"
	"testing"
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
