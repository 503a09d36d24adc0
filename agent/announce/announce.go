// Package announce is the agent's announce mode (docs/adr/0030): a
// machine the control plane does not know, booted by the netboot server
// with tether.announce=URL, reads its TPM's endorsement key and sends it
// with its hardware address, prints on the console what an admin runs to
// adopt it, and asks again until it is adopted and a boot of its node
// waits, when it reboots so that its firmware fetches that boot's script.
//
// Nothing here is a secret and nothing is proved: the announcement is a
// hint for an admin. The binding is the admin's act (tetherctl node
// adopt), and enrollment proves the TPM by credential activation.
package announce

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tetherfleet/tether/agent/enroll"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/pki/attestation"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// DefaultEvery is how often an unadopted machine asks again: an admin's
// adoption and provision are picked up within it, and a rack of machines
// waiting costs the control plane little.
const DefaultEvery = 15 * time.Second

// maxReplyBytes bounds what is read of an answer.
const maxReplyBytes = 16 << 10

// Config configures Run.
type Config struct {
	// URL is the netboot server's announce route (tether.announce=).
	URL string
	// MAC is the interface the machine booted from (BOOTIF=).
	MAC string
	// OpenTPM opens the machine's TPM; an error means there is none, and
	// the machine announces its address alone.
	OpenTPM func() (enroll.AttesterCloser, error)
	// Timeout bounds one announcement (default 10 s).
	Timeout time.Duration
	Clock   clock.Clock // default real
	Logf    func(format string, args ...any)
	// Every is the pause between announcements (default DefaultEvery).
	Every time.Duration
	// Reboot restarts the machine once a boot waits for it.
	Reboot func() error
}

// Run announces the machine until a boot waits for it, then reboots
// (returning Reboot's error), or until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	if cfg.URL == "" || cfg.MAC == "" {
		return errors.New("announce: needs the announce URL (tether.announce=) and the boot interface (BOOTIF=)")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.Every <= 0 {
		cfg.Every = DefaultEvery
	}
	a := &v1.NetbootAnnounce{Mac: cfg.MAC}
	ek := endorsement(cfg, a)
	cfg.Logf("no node has this machine's hardware address %s: announcing it to %s", cfg.MAC, cfg.URL)
	if ek != "" {
		cfg.Logf("this machine's TPM endorsement key is %s", ek)
		cfg.Logf("an admin adopts it, after checking the key above against `tetherctl netboot seen`, with: tetherctl node adopt %s --ek %s --template TEMPLATE [--name NAME]", cfg.MAC, ek)
	} else {
		cfg.Logf("an admin adopts it by its address with: tetherctl node create NAME --template TEMPLATE --mac %s", cfg.MAC)
	}
	body, err := proto.Marshal(a)
	if err != nil {
		return fmt.Errorf("announce: %w", err)
	}
	var last string
	for {
		reply, wait, err := Once(ctx, cfg.Timeout, cfg.URL, body)
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if msg := err.Error(); msg != last {
				cfg.Logf("announcing failed: %v; trying again every %s", err, cfg.Every)
				last = msg
			}
		case reply.State == v1.NetbootAnnounceReply_STATE_BOOT:
			cfg.Logf("%s; rebooting", reply.Message)
			return cfg.Reboot()
		default:
			if reply.Message != last {
				cfg.Logf("%s", reply.Message)
				last = reply.Message
			}
			if ek != "" && reply.EkHash != "" && reply.EkHash != ek {
				// A proxy or a bug changed the key on its way: say so, the
				// admin compares the console with netboot seen.
				cfg.Logf("the control plane recorded endorsement key %s, not this machine's %s: do not adopt the recorded one", reply.EkHash, ek)
			}
		}
		t := cfg.Clock.NewTimer(max(wait, cfg.Every))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C():
		}
	}
}

// endorsement reads the TPM's EK (and its certificate) into a, returning
// its hash; "" when the machine has no TPM or it cannot be read, which is
// said on the console.
func endorsement(cfg Config, a *v1.NetbootAnnounce) string {
	if cfg.OpenTPM == nil {
		cfg.Logf("this machine has no TPM to announce")
		return ""
	}
	t, err := cfg.OpenTPM()
	if err != nil {
		cfg.Logf("no TPM to announce: %v", err)
		return ""
	}
	defer t.Close()
	pub, cert, err := t.Endorsement()
	if err != nil {
		cfg.Logf("the TPM's endorsement key cannot be read (%v): announcing the address alone", err)
		return ""
	}
	h, err := attestation.EKHashDER(pub)
	if err != nil {
		cfg.Logf("the TPM's endorsement key is not one Tether takes (%v): announcing the address alone", err)
		return ""
	}
	a.EkPublic, a.EkCertificate = pub, cert
	return h
}

// Once sends one announcement (a marshalled v1.NetbootAnnounce) and
// returns the answer, and how long the server asked to wait when it
// refused for the rate. It speaks HTTP/1.1 on one connection itself
// (Request.Write, ReadResponse) rather than through http.Client, whose
// transport would add 0.6 MB to the agent in every initramfs for one
// POST to the netboot port.
func Once(ctx context.Context, timeout time.Duration, url string, body []byte) (*v1.NetbootAnnounceReply, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil || req.URL.Scheme != "http" {
		return nil, 0, fmt.Errorf("announce to %s: want http://HOST:PORT/PATH", url)
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Close = true
	host := req.URL.Host
	if req.URL.Port() == "" {
		host = net.JoinHostPort(req.URL.Hostname(), "80")
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, 0, fmt.Errorf("announce to %s: %w", url, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if err := req.Write(conn); err != nil {
		return nil, 0, fmt.Errorf("announce to %s: %w", url, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return nil, 0, fmt.Errorf("announce to %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxReplyBytes))
	if err != nil {
		return nil, 0, fmt.Errorf("announce to %s: read the answer: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		var wait time.Duration
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 && s < 3600 {
			wait = time.Duration(s) * time.Second
		}
		return nil, wait, fmt.Errorf("announce to %s: %s: %s", url, resp.Status, bytes.TrimSpace(b))
	}
	var r v1.NetbootAnnounceReply
	if err := proto.Unmarshal(b, &r); err != nil {
		return nil, 0, fmt.Errorf("announce to %s: the answer is not a NetbootAnnounceReply: %w", url, err)
	}
	return &r, 0, nil
}
