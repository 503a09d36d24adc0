package daemon

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/pki/ca"
)

// RenewServerCertOptions configure RenewServerCert.
type RenewServerCertOptions struct {
	DataDir string
	// Advertise adds names or addresses to the ones the certificate in
	// service carries (it keeps those).
	Advertise []string
	Clock     clock.Clock
}

// RenewServerCert issues a new server certificate and key under the data
// dir's CA and puts them in place of the old ones. A running tetherd
// picks them up within its check interval, or at once on SIGHUP. Each file
// is written beside its target and renamed over it, so a reader sees the
// old file or the new one, never half of either.
func RenewServerCert(o RenewServerCertOptions) (hosts []string, notAfter string, err error) {
	if o.DataDir == "" {
		return nil, "", errors.New("renew-server-cert: --data-dir is required")
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	authority, err := ca.Load(filepath.Join(o.DataDir, CADir), o.Clock)
	if err != nil {
		return nil, "", fmt.Errorf("renew-server-cert: %s is not a Tether data dir: %w", o.DataDir, err)
	}
	certPath, keyPath := filepath.Join(o.DataDir, ServerCertFile), filepath.Join(o.DataDir, ServerKeyFile)
	old, err := os.ReadFile(certPath)
	if err != nil {
		return nil, "", fmt.Errorf("renew-server-cert: %w", err)
	}
	cur, err := ca.ParseCertificatePEM(old)
	if err != nil {
		return nil, "", fmt.Errorf("renew-server-cert: %s: %w", certPath, err)
	}
	hosts = append(hosts, cur.DNSNames...)
	for _, ip := range cur.IPAddresses {
		hosts = append(hosts, ip.String())
	}
	for _, h := range append(append([]string{}, DefaultAdvertise...), o.Advertise...) {
		if !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, "", fmt.Errorf("renew-server-cert: %w", err)
	}
	c, err := authority.SignServer(hosts, key.Public())
	if err != nil {
		return nil, "", fmt.Errorf("renew-server-cert: %w", err)
	}
	keyPEM, err := ca.KeyPEM(key)
	if err != nil {
		return nil, "", fmt.Errorf("renew-server-cert: %w", err)
	}
	// The key first: a reload between the two renames finds a pair that
	// does not match, keeps the old certificate and tries again.
	if err := replaceFile(keyPath, keyPEM, 0o600); err != nil {
		return nil, "", err
	}
	if err := replaceFile(certPath, append(ca.CertPEM(c), authority.CertificatePEM()...), 0o644); err != nil {
		return nil, "", err
	}
	return hosts, c.NotAfter.UTC().Format("2006-01-02"), nil
}

func replaceFile(path string, data []byte, perm os.FileMode) error {
	tmp := path + ".new"
	_ = os.Remove(tmp)
	if err := ca.WriteFileExclusive(tmp, data, perm); err != nil {
		return fmt.Errorf("renew-server-cert: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("renew-server-cert: %w", err)
	}
	return nil
}
