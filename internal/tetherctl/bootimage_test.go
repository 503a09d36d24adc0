package tetherctl

import (
	"strings"
	"testing"
)

func TestNodeCmdline(t *testing.T) {
	ca := "sha256:" + strings.Repeat("ab", 32)
	tests := []struct {
		name, url, ca string
		signers       []string
		handoff       string
		extra         string
		want          string // substring of the line, or of the error when bad
		bad           bool
	}{
		{"plain", "https://10.0.2.2:7443", ca, nil, "", "", "console=ttyS0 tether.url=https://10.0.2.2:7443 tether.ca=" + ca, false},
		{"signers and extra", "https://cp:7443/", ca, []string{ca}, "", "quiet", "tether.url=https://cp:7443 tether.ca=" + ca + " tether.signers=" + ca + " quiet", false},
		{"hand-off", "https://cp:7443", ca, nil, "http://10.0.2.2:8080/", "", "tether.ca=" + ca + " tether.handoff=http://10.0.2.2:8080 ip=dhcp", false},
		{"hand-off, own ip=", "https://cp:7443", ca, nil, "http://nb:80", "ip=eth1:dhcp", "tether.handoff=http://nb:80 ip=eth1:dhcp", false},
		{"hand-off over https", "https://cp:7443", ca, nil, "https://nb:80", "", "--handoff", true},
		{"hand-off with a path", "https://cp:7443", ca, nil, "http://nb:80/uki", "", "--handoff", true},
		{"http", "http://cp:7443", ca, nil, "", "", "want https", true},
		{"a path", "https://cp:7443/x", ca, nil, "", "", "want https", true},
		{"a bad CA", "https://cp:7443", "sha256:zz", nil, "", "", "--ca", true},
		{"a bad signer", "https://cp:7443", ca, []string{"nope"}, "", "", "--signers", true},
		{"a token", "https://cp:7443", ca, nil, "", "tether.token=abc", "must not be baked", true},
		{"an instance", "https://cp:7443", ca, nil, "", "tether.instance=i-1", "must not be baked", true},
		{"a newline", "https://cp:7443", ca, nil, "", "quiet\ninit=/bin/sh", "control character", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := nodeCmdline(tc.url, tc.ca, tc.signers, "ttyS0", tc.handoff, tc.extra)
			if tc.bad {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("nodeCmdline = %q, %v; want an error saying %q", got, err, tc.want)
				}
				return
			}
			if err != nil || !strings.Contains(got, tc.want) {
				t.Fatalf("nodeCmdline = %q, %v; want it to hold %q", got, err, tc.want)
			}
		})
	}
}
