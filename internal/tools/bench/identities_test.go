package bench

import (
	"crypto/ed25519"
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestIdentitiesRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ids.jsonl")
	f, known, err := OpenIdentities(path)
	if err != nil || len(known) != 0 {
		t.Fatalf("open a new file: %d known, %v", len(known), err)
	}
	var want []*SimAgent
	for _, id := range []string{"i-1", "i-2"} {
		_, key, _ := ed25519.GenerateKey(nil)
		a := &SimAgent{InstanceID: id, Cert: tls.Certificate{Certificate: [][]byte{[]byte("der-" + id)}, PrivateKey: key}}
		if err := f.Save(a); err != nil {
			t.Fatal(err)
		}
		want = append(want, a)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	f, known, err = OpenIdentities(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if len(known) != len(want) {
		t.Fatalf("read back %d identities, want %d", len(known), len(want))
	}
	for i, a := range known {
		if a.InstanceID != want[i].InstanceID || string(a.Cert.Certificate[0]) != string(want[i].Cert.Certificate[0]) ||
			!a.Cert.PrivateKey.(ed25519.PrivateKey).Equal(want[i].Cert.PrivateKey) {
			t.Errorf("identity %d read back as %s, want %s with the same certificate and key", i, a.InstanceID, want[i].InstanceID)
		}
	}
}

func TestIdentitiesRefuseABadFile(t *testing.T) {
	for name, content := range map[string]string{
		"not json":    "{\n",
		"no instance": `{"cert_der":"AA==","ed25519_seed":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}` + "\n",
		"short seed":  `{"instance_id":"i","cert_der":"AA==","ed25519_seed":"AA=="}` + "\n",
		"no cert":     `{"instance_id":"i","ed25519_seed":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}` + "\n",
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "ids.jsonl")
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, _, err := OpenIdentities(path); err == nil || !strings.Contains(err.Error(), "line 1") {
				t.Fatalf("open %s: err %v, want one naming line 1", name, err)
			}
		})
	}
}

func TestMergeTimelinesSumsBySecond(t *testing.T) {
	a := []Second{{Unix: 10, Connects: 1}, {Unix: 12, Reconnects: 2, Connects: 2}}
	b := []Second{{Unix: 12, Reconnects: 1, Connects: 1, Failures: 3}, {Unix: 11, Failures: 1}}
	got := MergeTimelines(a, b)
	want := []Second{{Unix: 10, Connects: 1}, {Unix: 11, Failures: 1}, {Unix: 12, Connects: 3, Reconnects: 3, Failures: 3}}
	if len(got) != len(want) {
		t.Fatalf("merged %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("merged %v, want %v", got, want)
		}
	}
}
