package announce_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tetherfleet/tether/agent/announce"
	"github.com/tetherfleet/tether/agent/enroll"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/testkit/logbuf"
	"github.com/tetherfleet/tether/pki/attestation"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// fakeTPM answers Endorsement with a fixed key.
type fakeTPM struct {
	pub, cert []byte
	err       error
	closed    bool
}

func (f *fakeTPM) Endorsement() ([]byte, []byte, error) { return f.pub, f.cert, f.err }
func (f *fakeTPM) NewKey() (enroll.AttestationKey, error) {
	return nil, errors.New("announce makes no key")
}
func (f *fakeTPM) Close() error { f.closed = true; return nil }

func ekDER(t *testing.T) ([]byte, string) {
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
	return der, h
}

// control is a netboot server's announce route that answers from a
// script of replies, recording what it was sent.
type control struct {
	mu      sync.Mutex
	got     []*v1.NetbootAnnounce
	replies []func(w http.ResponseWriter)
}

func (c *control) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var a v1.NetbootAnnounce
	if err := proto.Unmarshal(b, &a); err != nil || r.Method != http.MethodPost {
		http.Error(w, "bad", http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	c.got = append(c.got, &a)
	reply := c.replies[min(len(c.got), len(c.replies))-1]
	c.mu.Unlock()
	reply(w)
}

func answer(r *v1.NetbootAnnounceReply) func(http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		b, _ := proto.Marshal(r)
		_, _ = w.Write(b)
	}
}

// TestAnnounceUntilABootWaits: the agent sends its MAC and EK, prints the
// key and the adopt command, says each new answer once, waits between
// tries (longer when the server asks), and reboots when a boot waits.
func TestAnnounceUntilABootWaits(t *testing.T) {
	pub, hash := ekDER(t)
	tpm := &fakeTPM{pub: pub}
	c := &control{replies: []func(http.ResponseWriter){
		answer(&v1.NetbootAnnounceReply{State: v1.NetbootAnnounceReply_STATE_ANNOUNCED, EkHash: hash, Message: "announced: adopt me"}),
		answer(&v1.NetbootAnnounceReply{State: v1.NetbootAnnounceReply_STATE_ANNOUNCED, EkHash: hash, Message: "announced: adopt me"}),
		func(w http.ResponseWriter) {
			w.Header().Set("Retry-After", "40")
			http.Error(w, "too many", http.StatusTooManyRequests)
		},
		answer(&v1.NetbootAnnounceReply{State: v1.NetbootAnnounceReply_STATE_ADOPTED, Node: "rack1", Message: "adopted as node rack1; waiting"}),
		answer(&v1.NetbootAnnounceReply{State: v1.NetbootAnnounceReply_STATE_BOOT, Node: "rack1", Message: "node rack1 has an instance booting"}),
	}}
	srv := httptest.NewServer(c)
	defer srv.Close()
	clk := clock.NewFake(time.Now())
	var console logbuf.Buffer
	rebooted := make(chan struct{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- announce.Run(ctx, announce.Config{URL: srv.URL + "/netboot/announce", MAC: "52:54:00:ad:00:01", Clock: clk,
			OpenTPM: func() (enroll.AttesterCloser, error) { return tpm, nil },
			Logf:    func(f string, a ...any) { fmt.Fprintf(&console, f+"\n", a...) },
			Every:   10 * time.Second, Reboot: func() error { close(rebooted); return nil }})
	}()
	waits := []time.Duration{10 * time.Second, 10 * time.Second, 40 * time.Second, 10 * time.Second}
	for i, want := range waits {
		if err := clk.BlockUntilPending(ctx, func(p []time.Duration) bool { return len(p) == 1 }); err != nil {
			t.Fatalf("wait %d: %v\n%s", i, err, console.String())
		}
		if p := clk.Pending(); p[0] != want {
			t.Fatalf("wait %d is %v, want %v", i, p[0], want)
		}
		clk.Advance(want)
	}
	select {
	case <-rebooted:
	case <-ctx.Done():
		t.Fatalf("no reboot:\n%s", console.String())
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	out := console.String()
	for _, want := range []string{"this machine's TPM endorsement key is " + hash,
		"tetherctl node adopt 52:54:00:ad:00:01 --ek " + hash + " --template TEMPLATE", "429 Too Many Requests", "adopted as node rack1", "rebooting"} {
		if !strings.Contains(out, want) {
			t.Errorf("console lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "announced: adopt me"); n != 1 {
		t.Errorf("the same answer was printed %d times, want once:\n%s", n, out)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.got) != 5 || c.got[0].Mac != "52:54:00:ad:00:01" || string(c.got[0].EkPublic) != string(pub) {
		t.Fatalf("sent %d announcements, first %v", len(c.got), c.got[0])
	}
	if !tpm.closed {
		t.Error("the TPM was left open")
	}
}

// TestAnnounceWithoutTPM: a machine with no TPM (or one whose key cannot
// be read) announces its address alone and says how to adopt it by MAC.
func TestAnnounceWithoutTPM(t *testing.T) {
	for _, tc := range []struct {
		name string
		open func() (enroll.AttesterCloser, error)
		say  string
	}{
		{"no TPM", func() (enroll.AttesterCloser, error) { return nil, errors.New("no /dev/tpmrm0") }, "no TPM to announce: no /dev/tpmrm0"},
		{"unreadable", func() (enroll.AttesterCloser, error) { return &fakeTPM{err: errors.New("TPM_RC_FAILURE")}, nil }, "cannot be read (TPM_RC_FAILURE)"},
		{"not an EK", func() (enroll.AttesterCloser, error) { return &fakeTPM{pub: []byte("junk")}, nil }, "not one Tether takes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &control{replies: []func(http.ResponseWriter){
				answer(&v1.NetbootAnnounceReply{State: v1.NetbootAnnounceReply_STATE_BOOT, Node: "n", Message: "boot"}),
			}}
			srv := httptest.NewServer(c)
			defer srv.Close()
			var console logbuf.Buffer
			err := announce.Run(context.Background(), announce.Config{URL: srv.URL, MAC: "52:54:00:ad:00:02", OpenTPM: tc.open,
				Logf: func(f string, a ...any) { fmt.Fprintf(&console, f+"\n", a...) }, Reboot: func() error { return nil }})
			if err != nil {
				t.Fatal(err)
			}
			out := console.String()
			for _, want := range []string{tc.say, "tetherctl node create NAME --template TEMPLATE --mac 52:54:00:ad:00:02"} {
				if !strings.Contains(out, want) {
					t.Errorf("console lacks %q:\n%s", want, out)
				}
			}
			if len(c.got) != 1 || len(c.got[0].EkPublic) != 0 {
				t.Fatalf("announcements %v, want one with no EK", c.got)
			}
		})
	}
}

func TestAnnounceNeedsURLAndMAC(t *testing.T) {
	if err := announce.Run(context.Background(), announce.Config{URL: "http://x/netboot/announce"}); err == nil || !strings.Contains(err.Error(), "BOOTIF") {
		t.Fatalf("Run without a MAC = %v", err)
	}
}
