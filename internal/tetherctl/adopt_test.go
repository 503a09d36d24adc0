package tetherctl_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	"github.com/tetherfleet/tether/pki/attestation"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// TestNetbootSeenAndNodeAdopt: an announced EK shows in `netboot seen`
// (table and JSON; several for one address are all listed), `node adopt`
// binds it and says what it did, a refusal is a non-zero exit with the
// reason, and an adopted address leaves the list.
func TestNetbootSeenAndNodeAdopt(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cp := testcp.Start(t, testcp.With(func(o *daemon.ServeOptions) { o.Test.NetbootListener, o.Listeners.NetbootAnnounce = lis, true }))
	cfg := filepath.Join(cp.DataDir, daemon.AdminDir, daemon.ClientConfig)
	base := []string{"--config", cfg, "--endpoint", cp.Addr}
	announce := func(mac string) string {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		der, _ := x509.MarshalPKIXPublicKey(&k.PublicKey)
		h, _ := attestation.EKHashDER(der)
		b, _ := proto.Marshal(&v1.NetbootAnnounce{Mac: mac, EkPublic: der})
		resp, err := http.Post("http://"+lis.Addr().String()+"/netboot/announce", "application/x-protobuf", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("announce: %s", resp.Status)
		}
		return h
	}
	ekA := announce("52:54:00:ad:03:01")
	ekB := announce("52:54:00:ad:03:02")
	ekC := announce("52:54:00:ad:03:02") // a second sender claims the address

	out, errOut, code := run(t, append(base, "netboot", "seen")...)
	if code != 0 {
		t.Fatalf("netboot seen: exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"TPM EK", "52:54:00:ad:03:01  " + ekA, "52:54:00:ad:03:02  " + ekC, ekB + " (also announced)"} {
		if !strings.Contains(out, want) {
			t.Errorf("netboot seen lacks %q:\n%s", want, out)
		}
	}
	out, _, _ = run(t, append(base, "netboot", "seen", "-o", "json")...)
	var seen struct {
		Machines []struct {
			MAC string `json:"mac"`
			EKs []struct {
				EK string `json:"ek"`
			} `json:"eks"`
		} `json:"machines"`
	}
	if err := json.Unmarshal([]byte(out), &seen); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	eks := map[string]int{}
	for _, m := range seen.Machines {
		eks[m.MAC] = len(m.EKs)
	}
	if eks["52:54:00:ad:03:01"] != 1 || eks["52:54:00:ad:03:02"] != 2 {
		t.Fatalf("netboot seen -o json: %s", out)
	}

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "os-release"), []byte("ID=x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"module", "build", dir, "base:1"}, {"template", "create", "web", "--root", "base:1"}} {
		if out, errOut, code := run(t, append(base, args...)...); code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
	}
	// Two keys for one address: the admin must say which.
	out, errOut, code = run(t, append(base, "node", "adopt", "52:54:00:ad:03:02", "--template", "web")...)
	if code == 0 || !strings.Contains(errOut, "2 endorsement keys were announced") {
		t.Fatalf("adopting an address two keys were announced for: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = run(t, append(base, "node", "adopt", "52:54:00:ad:03:02", "--ek", ekB, "--template", "web", "--name", "rack1-08")...)
	if code != 0 || !strings.Contains(out, "rack1-08") || !strings.Contains(out, "Node rack1-08 created; its TPM is bound as the machine announced it") ||
		!strings.Contains(out, ekB) {
		t.Fatalf("node adopt: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = run(t, append(base, "node", "adopt", "52:54:00:ad:03:01", "--template", "web", "-o", "json")...)
	compact := strings.Join(strings.Fields(out), "")
	if code != 0 || !strings.Contains(compact, `"created":true`) || !strings.Contains(compact, `"announced":true`) || !strings.Contains(out, ekA) {
		t.Fatalf("node adopt -o json: exit %d\n%s%s", code, out, errOut)
	}
	out, _, _ = run(t, append(base, "netboot", "seen")...)
	if strings.Contains(out, "52:54:00:ad:03:0") {
		t.Fatalf("adopted addresses are still listed:\n%s", out)
	}
	// An external boot of the adopted node carries no token, and says
	// what the machine boots with instead.
	out, errOut, code = run(t, append(base, "instance", "provision", "--node", "rack1-08", "--provider", "external")...)
	if code != 0 || strings.Contains(out, "tether.token=") || !strings.Contains(out, "no token: its TPM proves it") || !strings.Contains(out, "tether.instance=") {
		t.Fatalf("instance provision of an adopted node: exit %d\n%s%s", code, out, errOut)
	}
}
