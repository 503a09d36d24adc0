package tetherctl

import (
	"crypto/x509"
	"strings"
	"testing"
	"time"
)

func TestExpiryWarning(t *testing.T) {
	now := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		left time.Duration
		want string
	}{
		{"years left", 5 * 365 * 24 * time.Hour, ""},
		{"just over 30 days", 30*24*time.Hour + time.Minute, ""},
		{"29 days", 29*24*time.Hour + time.Hour, "in 29 days"},
		{"hours", 5 * time.Hour, "in 0 days"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := expiryWarning(&x509.Certificate{NotAfter: now.Add(tc.left)}, now)
			if tc.want == "" && got != "" || tc.want != "" && (!strings.Contains(got, tc.want) || !strings.Contains(got, "renew-server-cert")) {
				t.Fatalf("expiryWarning = %q, want %q", got, tc.want)
			}
		})
	}
}
