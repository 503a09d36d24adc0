// Package certreload serves tetherd's TLS certificate from its files and
// picks up a new one without a restart: on a signal (SIGHUP) or when the
// files change, checked by a cheap stat on each tick. A pair that does not
// load (a half-written file, a key that does not match) keeps the old
// certificate in service and is reported, so a mistake never takes the
// port down.
package certreload

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetherfleet/tether/internal/clock"
)

// WarnBefore is how long before expiry the certificate in service is
// reported at every load (and tetherctl warns its users).
const WarnBefore = 30 * 24 * time.Hour

// Reloader holds the certificate in service.
type Reloader struct {
	certFile, keyFile string
	clock             clock.Clock
	log               *slog.Logger

	cur atomic.Pointer[tls.Certificate]
	mu  sync.Mutex // one reload at a time
	// seen is the files' stat when cur was loaded.
	seen stamp
}

type stamp struct {
	certMod, keyMod   time.Time
	certSize, keySize int64
}

// New loads the pair; it fails when the pair does not load.
func New(certFile, keyFile string, clk clock.Clock, log *slog.Logger) (*Reloader, error) {
	r := &Reloader{certFile: certFile, keyFile: keyFile, clock: clk, log: log}
	if _, err := r.Reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// GetCertificate is tls.Config.GetCertificate.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.cur.Load(), nil
}

// Leaf is the certificate in service.
func (r *Reloader) Leaf() *x509.Certificate { return r.cur.Load().Leaf }

// Reload loads the files again and puts the pair in service when it loads;
// changed reports whether the certificate in service changed.
func (r *Reloader) Reload() (changed bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st, err := r.stat()
	if err != nil {
		return false, err
	}
	pair, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return false, fmt.Errorf("server certificate %s / key %s: %w", r.certFile, r.keyFile, err)
	}
	if pair.Leaf == nil {
		if pair.Leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return false, fmt.Errorf("server certificate %s: %w", r.certFile, err)
		}
	}
	now := r.clock.Now()
	if now.After(pair.Leaf.NotAfter) {
		return false, fmt.Errorf("server certificate %s expired on %s", r.certFile, pair.Leaf.NotAfter.Format(time.RFC3339))
	}
	old := r.cur.Load()
	r.seen = st
	if old != nil && string(old.Certificate[0]) == string(pair.Certificate[0]) {
		return false, nil
	}
	r.cur.Store(&pair)
	if old != nil {
		r.log.Info("server certificate reloaded", "serial", pair.Leaf.SerialNumber.Text(16), "expires", pair.Leaf.NotAfter)
	}
	if left := pair.Leaf.NotAfter.Sub(now); left < WarnBefore {
		r.log.Warn("the server certificate expires soon: issue a new one with `tetherd renew-server-cert`; tetherd picks it up without a restart",
			"expires", pair.Leaf.NotAfter, "days_left", int(left.Hours()/24))
	}
	return true, nil
}

// Check reloads when the files changed since the last load (their size
// or modification time), and does nothing otherwise: a stat of two files
// per tick.
func (r *Reloader) Check() (changed bool, err error) {
	st, err := r.stat()
	if err != nil {
		return false, err
	}
	r.mu.Lock()
	same := st == r.seen
	r.mu.Unlock()
	if same {
		return false, nil
	}
	return r.Reload()
}

func (r *Reloader) stat() (stamp, error) {
	c, err := os.Stat(r.certFile)
	if err != nil {
		return stamp{}, fmt.Errorf("server certificate: %w", err)
	}
	k, err := os.Stat(r.keyFile)
	if err != nil {
		return stamp{}, fmt.Errorf("server key: %w", err)
	}
	return stamp{certMod: c.ModTime(), keyMod: k.ModTime(), certSize: c.Size(), keySize: k.Size()}, nil
}
