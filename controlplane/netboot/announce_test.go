package netboot_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tetherfleet/tether/agent/tpm"
	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/netboot"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/throttle"
	"github.com/tetherfleet/tether/internal/testkit/swtpmtest"
	"github.com/tetherfleet/tether/pki/attestation"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// post sends body to the announce route as if from remote.
func (f *fixture) post(t *testing.T, remote string, body []byte) (int, *v1.NetbootAnnounceReply, string) {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, netboot.AnnouncePath, bytes.NewReader(body))
	req.Header.Set("Content-Type", netboot.AnnounceContentType)
	req.RemoteAddr = remote
	rec := httptest.NewRecorder()
	f.nb.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		return rec.Code, nil, rec.Body.String()
	}
	var r v1.NetbootAnnounceReply
	if err := proto.Unmarshal(rec.Body.Bytes(), &r); err != nil {
		t.Fatalf("reply is not a NetbootAnnounceReply: %v", err)
	}
	return rec.Code, &r, ""
}

func (f *fixture) announce(t *testing.T, remote string, a *v1.NetbootAnnounce) (int, *v1.NetbootAnnounceReply, string) {
	t.Helper()
	b, err := proto.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	return f.post(t, remote, b)
}

func (f *fixture) announcements(t *testing.T) []*store.Event {
	t.Helper()
	evs, err := f.st.ListEvents(f.ctx, store.EventFilter{Kind: events.NetbootAnnounced}, store.Page{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// fakeEK is an ECDSA P-256 key in PKIX DER (a TPM's ECC EK has that
// form; ECDSA keys are quick to make by the hundred), with its hash.
func fakeEK(t testing.TB) ([]byte, string, *ecdsa.PrivateKey) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	h, err := attestation.EKHashDER(der)
	if err != nil {
		t.Fatal(err)
	}
	return der, h, k
}

// certFor is a self-signed certificate for key.
func certFor(t *testing.T, key *ecdsa.PrivateKey) []byte {
	t.Helper()
	tpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "not an EK"}, NotBefore: t0, NotAfter: t0.Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

const unknownMAC = "52:54:00:ad:00:01"

// TestAnnounceOffByDefault: without --netboot-announce an unknown machine
// gets the refusal script as before (it may have a disk to fall back to),
// and the announce route does not exist.
func TestAnnounceOffByDefault(t *testing.T) {
	f := setup(t)
	_, body := f.get(t, netboot.BootPath(unknownMAC))
	if !strings.HasSuffix(body, "\nexit 1\n") || strings.Contains(body, "tether.announce") {
		t.Fatalf("an unknown machine was not refused with announcements off:\n%s", body)
	}
	ek, _, _ := fakeEK(t)
	if code, _, msg := f.announce(t, "10.0.0.5:68", &v1.NetbootAnnounce{Mac: unknownMAC, EkPublic: ek}); code != http.StatusNotFound || !strings.Contains(msg, "--netboot-announce") {
		t.Fatalf("announce with announcements off: %d %q", code, msg)
	}
	if n := len(f.announcements(t)); n != 0 {
		t.Fatalf("%d announcements recorded with announcements off", n)
	}
}

// TestUnknownMACBootsIntoAnnounce: the unknown machine gets the default
// kernel and initramfs with the announce URL and its boot interface, and
// no secret; its refusal is still recorded for netboot seen.
func TestUnknownMACBootsIntoAnnounce(t *testing.T) {
	f := setup(t)
	f.nb.Announce = true
	code, body := f.get(t, netboot.BootPath(unknownMAC))
	if code != http.StatusOK || !strings.HasPrefix(body, "#!ipxe\necho Tether: no node has hardware address "+unknownMAC) {
		t.Fatalf("%d %q", code, body)
	}
	for _, want := range []string{"kernel http://10.0.2.2:8080/artifacts/sha256:", " ip=dhcp BOOTIF=01-52-54-00-ad-00-01 ",
		" tether.announce=http://10.0.2.2:8080/netboot/announce\n", "console=ttyS0", "initrd --name initramfs http://10.0.2.2:8080/artifacts/sha256:", "\nboot\n"} {
		if !strings.Contains(body, want) {
			t.Errorf("announce script lacks %q:\n%s", want, body)
		}
	}
	for _, bad := range []string{"tether.token", "tether.url", "tether.instance"} {
		if strings.Contains(body, bad) {
			t.Errorf("announce script carries %s:\n%s", bad, body)
		}
	}
	evs := f.machineRefusals(t)
	if len(evs) != 1 || !strings.Contains(string(evs[0].Payload), `"reason":"`+events.RefusedUnknownMAC+`"`) {
		t.Fatalf("refusal events %v, want one unknown_mac", evs)
	}
	// A known machine is not affected.
	f.bindMAC(t, mac)
	f.provision(t)
	if _, body := f.get(t, netboot.BootPath(mac)); !strings.Contains(body, "tether.token=") {
		t.Fatalf("a known machine did not get its script:\n%s", body)
	}
}

// TestAnnounceRecordsTheEK: a swtpm's real EK and EK certificate are
// recorded once per window under the MAC, and the reply tells the machine
// what an admin runs; once the MAC is a node's the reply says to wait,
// and once an instance of it boots, to reboot.
func TestAnnounceRecordsTheEK(t *testing.T) {
	sw := swtpmtest.Start(t)
	tp, err := tpm.OpenChannel(sw.Dial(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	ek, err := tp.EK()
	if err != nil {
		t.Fatal(err)
	}
	hash, _ := attestation.EKHashDER(ek.PublicDER)
	f := setup(t)
	f.nb.Announce = true
	a := &v1.NetbootAnnounce{Mac: "52-54-00-AD-00-01", EkPublic: ek.PublicDER, EkCertificate: ek.CertificateDER}
	for range 3 {
		code, r, msg := f.announce(t, "10.0.0.5:68", a)
		if code != http.StatusOK {
			t.Fatalf("%d %s", code, msg)
		}
		if r.State != v1.NetbootAnnounceReply_STATE_ANNOUNCED || r.EkHash != hash || !strings.Contains(r.Message, "tetherctl node adopt "+unknownMAC+" --ek "+hash) {
			t.Fatalf("reply %v, want announced with EK %s and the adopt command", r, hash)
		}
	}
	evs := f.announcements(t)
	if len(evs) != 1 {
		t.Fatalf("%d announcement events for three tries in a window, want 1", len(evs))
	}
	e := evs[0]
	if e.CorrelationID != events.AnnounceCorrelation(unknownMAC) {
		t.Errorf("correlation %q, want %q", e.CorrelationID, events.AnnounceCorrelation(unknownMAC))
	}
	for _, want := range []string{`"mac":"` + unknownMAC + `"`, `"ek":"` + hash + `"`, `"ek_certificate":true`, `"ek_certificate_issuer":`} {
		if !strings.Contains(string(e.Payload), want) {
			t.Errorf("payload %s lacks %s", e.Payload, want)
		}
	}

	// Adopted: wait for a boot.
	f.bindMAC(t, unknownMAC)
	if _, r, _ := f.announce(t, "10.0.0.5:68", a); r.GetState() != v1.NetbootAnnounceReply_STATE_ADOPTED || r.Node != "n" {
		t.Fatalf("reply for an adopted machine %v, want adopted as n", r)
	}
	// A boot waits: reboot into it.
	f.provision(t)
	if _, r, _ := f.announce(t, "10.0.0.5:68", a); r.GetState() != v1.NetbootAnnounceReply_STATE_BOOT || r.Node != "n" {
		t.Fatalf("reply with a booting instance %v, want boot", r)
	}
	if n := len(f.announcements(t)); n != 1 {
		t.Fatalf("%d announcement events; a known machine's announcement must not be recorded", n)
	}
}

// TestAnnounceRefusals: each bad announcement is refused with its reason,
// records no EK, and leaves one coalesced netboot.refused event.
func TestAnnounceRefusals(t *testing.T) {
	ek, _, key := fakeEK(t)
	_, _, otherKey := fakeEK(t)
	marshal := func(a *v1.NetbootAnnounce) []byte { b, _ := proto.Marshal(a); return b }
	tests := []struct {
		name string
		body []byte
		code int
		say  string
	}{
		{"oversized", bytes.Repeat([]byte{0}, netboot.MaxAnnounceBytes+1), http.StatusRequestEntityTooLarge, fmt.Sprintf("at most %d bytes", netboot.MaxAnnounceBytes)},
		{"not protobuf", []byte("\xff\xff\xff garbage"), http.StatusBadRequest, "not a tether.v1.NetbootAnnounce"},
		{"no mac", marshal(&v1.NetbootAnnounce{EkPublic: ek}), http.StatusBadRequest, "mac: not a valid hardware address"},
		{"multicast mac", marshal(&v1.NetbootAnnounce{Mac: "01:00:5e:00:00:01", EkPublic: ek}), http.StatusBadRequest, "mac: not a valid hardware address"},
		{"EK not a key", marshal(&v1.NetbootAnnounce{Mac: unknownMAC, EkPublic: []byte("not DER")}), http.StatusBadRequest, "ek_public:"},
		{"EK too large", marshal(&v1.NetbootAnnounce{Mac: unknownMAC, EkPublic: make([]byte, attestation.MaxEKBytes+1)}), http.StatusBadRequest, "at most 4096"},
		{"certificate for another key", marshal(&v1.NetbootAnnounce{Mac: unknownMAC, EkPublic: ek, EkCertificate: certFor(t, otherKey)}), http.StatusBadRequest, "ek_certificate:"},
		{"certificate not a certificate", marshal(&v1.NetbootAnnounce{Mac: unknownMAC, EkPublic: ek, EkCertificate: []byte("nope")}), http.StatusBadRequest, "ek_certificate:"},
		{"certificate without EK", marshal(&v1.NetbootAnnounce{Mac: unknownMAC, EkCertificate: certFor(t, key)}), http.StatusBadRequest, "ek_certificate without ek_public"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := setup(t)
			f.nb.Announce = true
			for range 3 {
				code, _, msg := f.post(t, "10.0.0.9:68", tc.body)
				if code != tc.code || !strings.Contains(msg, tc.say) {
					t.Fatalf("%d %q, want %d saying %q", code, msg, tc.code, tc.say)
				}
			}
			if n := len(f.announcements(t)); n != 0 {
				t.Fatalf("%d announcements recorded from a bad one", n)
			}
			evs := f.machineRefusals(t)
			if len(evs) != 1 || !strings.Contains(string(evs[0].Payload), `"reason":"`+events.RefusedMalformedAnnounce+`"`) {
				t.Fatalf("refusal events %v, want one malformed_announce for three tries", evs)
			}
		})
	}
}

// TestAnnounceFloodIsCapped: one sender announcing made-up keys for
// made-up (or one victim's) addresses records at most 16 a window and a
// summary of the rest; 49 senders together record at most 256.
func TestAnnounceFloodIsCapped(t *testing.T) {
	const flood = 100
	eks := make([][]byte, flood)
	for i := range eks {
		eks[i], _, _ = fakeEK(t)
	}
	t.Run("one source", func(t *testing.T) {
		f := setup(t)
		f.nb.Announce = true
		for i := range flood {
			m := unknownMAC // half for one victim's address, half made up
			if i%2 == 1 {
				m = fmt.Sprintf("52:54:00:ab:%02x:%02x", i/256, i%256)
			}
			if code, _, msg := f.announce(t, "10.0.0.7:68", &v1.NetbootAnnounce{Mac: m, EkPublic: eks[i]}); code != http.StatusOK {
				t.Fatalf("announcement %d: %d %s", i, code, msg)
			}
		}
		if n := len(f.announcements(t)); n != 16 {
			t.Fatalf("%d announcements recorded from one source, want the cap of 16", n)
		}
		f.clk.Advance(2 * time.Minute)
		f.nb.FlushRefusals(f.ctx, false)
		var sums []*store.Event
		for _, e := range f.announcements(t) {
			if strings.Contains(e.Message, "were counted, not recorded") {
				sums = append(sums, e)
			}
		}
		if len(sums) != 1 || !strings.Contains(sums[0].Message, fmt.Sprintf("%d more netboot announcements from 10.0.0.7", flood-16)) {
			t.Fatalf("summaries %v, want one counting %d", sums, flood-16)
		}
	})
	t.Run("many sources", func(t *testing.T) {
		f := setup(t)
		f.nb.Announce = true
		const sources = 20 // x 16 = 320, past the 256 over all sources
		for src := range sources {
			for i := range 16 {
				m := fmt.Sprintf("52:54:01:%02x:%02x:01", src, i)
				if code, _, msg := f.announce(t, fmt.Sprintf("10.9.0.%d:68", src+1), &v1.NetbootAnnounce{Mac: m, EkPublic: eks[(src*16+i)%flood]}); code != http.StatusOK {
					t.Fatalf("%d %s", code, msg)
				}
			}
		}
		if n := len(f.announcements(t)); n != 256 {
			t.Fatalf("%d announcements recorded from %d sources, want the cap of 256", n, sources)
		}
	})
}

// TestAnnounceIsRateLimited: the per-source limit of the script routes
// applies, with a Retry-After the agent honours.
func TestAnnounceIsRateLimited(t *testing.T) {
	f := setup(t)
	f.nb.Announce = true
	f.nb.Limiter = throttle.NewLimiter(f.clk, 0.1, 2, 0)
	ek, _, _ := fakeEK(t)
	b, _ := proto.Marshal(&v1.NetbootAnnounce{Mac: unknownMAC, EkPublic: ek})
	for i := range 2 {
		if code, _, msg := f.post(t, "10.0.0.5:68", b); code != http.StatusOK {
			t.Fatalf("request %d within the burst: %d %s", i, code, msg)
		}
	}
	req := httptest.NewRequest(http.MethodPost, netboot.AnnouncePath, bytes.NewReader(b))
	req.RemoteAddr = "10.0.0.5:68"
	rec := httptest.NewRecorder()
	f.nb.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("past the burst: %d, Retry-After %q", rec.Code, rec.Header().Get("Retry-After"))
	}
}
