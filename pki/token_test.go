package pki

import (
	"strings"
	"testing"
)

func TestTokenRoundTrip(t *testing.T) {
	tok, hash, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseToken(tok)
	if err != nil || got != hash {
		t.Fatalf("ParseToken(NewToken()) = %q, %v; want %q", got, err, hash)
	}
	for _, bad := range []string{"", "tbt_", "tbt_short", "xyz_" + tok[4:], tok + "A", strings.Repeat("A", 1000), tok[:len(tok)-1] + "!"} {
		if _, err := ParseToken(bad); err == nil {
			t.Errorf("ParseToken(%q) accepted a malformed token", bad)
		}
	}
}

func FuzzParseToken(f *testing.F) {
	tok, _, _ := NewToken()
	for _, s := range []string{tok, "", "tbt_", "tbt_" + strings.Repeat("A", 43), "tbt_" + strings.Repeat("/", 43)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		hash, err := ParseToken(s)
		if err != nil {
			return
		}
		// Anything accepted has the exact shape NewToken makes and hashes stably.
		if !strings.HasPrefix(s, TokenPrefix) || len(s) != len(tok) || hash != HashToken(s) || len(hash) != 64 {
			t.Fatalf("accepted %q -> %q", s, hash)
		}
	})
}

func TestParseFingerprint(t *testing.T) {
	good := strings.Repeat("ab", 32)
	for in, ok := range map[string]bool{"sha256:" + good: true, good: true, "SHA256:" + good: false, "sha256:" + strings.ToUpper(good): true, "sha256:xyz": false, "": false} {
		_, err := ParseFingerprint(in)
		if (err == nil) != ok {
			t.Errorf("ParseFingerprint(%q) err=%v, want ok=%v", in, err, ok)
		}
	}
}
