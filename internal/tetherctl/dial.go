package tetherctl

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"gopkg.in/yaml.v3"

	"github.com/tetherfleet/tether/pki"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

type clientConfig struct {
	Endpoint string `yaml:"endpoint"`
	CA       string `yaml:"ca"`
	Cert     string `yaml:"cert"`
	Key      string `yaml:"key"`
}

func (a *App) configPath() (string, string) {
	if a.ConfigPath != "" {
		return a.ConfigPath, "--config"
	}
	if p := os.Getenv("TETHERCONFIG"); p != "" {
		return p, "$TETHERCONFIG"
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".config", "tether", "config.yaml"), "the default location"
}

// readConfig reads the client config and its CA certificate; rel turns
// the config's paths into paths from here.
func (a *App) readConfig() (cfg clientConfig, rel func(string) string, caPEM []byte, err error) {
	path, src := a.configPath()
	a.cfgSrc = fmt.Sprintf("%s (from %s)", path, src)
	raw, err := os.ReadFile(path)
	if err != nil {
		return cfg, nil, nil, fmt.Errorf("read client config %s: %w\n  hint: `tetherd init --data-dir DIR` writes one to DIR/admin/tetherconfig.yaml; pass it with --config or $TETHERCONFIG", a.cfgSrc, err)
	}
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		return cfg, nil, nil, fmt.Errorf("parse client config %s: %w", a.cfgSrc, err)
	}
	rel = func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(filepath.Dir(path), p)
	}
	for _, f := range []struct{ name, v string }{{"ca", cfg.CA}, {"cert", cfg.Cert}, {"key", cfg.Key}} {
		if f.v == "" {
			return cfg, nil, nil, fmt.Errorf("client config %s: %q is not set", a.cfgSrc, f.name)
		}
	}
	if caPEM, err = os.ReadFile(rel(cfg.CA)); err != nil {
		return cfg, nil, nil, fmt.Errorf("client config %s: CA certificate: %w", a.cfgSrc, err)
	}
	return cfg, rel, caPEM, nil
}

// dial connects once per process.
func (a *App) dial() (v1.AdminServiceClient, error) {
	if a.client != nil {
		return a.client, nil
	}
	cfg, rel, caPEM, err := a.readConfig()
	if err != nil {
		return nil, err
	}
	cas, err := parseCerts(caPEM)
	if err != nil || len(cas) == 0 {
		return nil, fmt.Errorf("client config %s: %s holds no PEM certificate", a.cfgSrc, rel(cfg.CA))
	}
	cert, err := tls.LoadX509KeyPair(rel(cfg.Cert), rel(cfg.Key))
	if err != nil {
		return nil, fmt.Errorf("client config %s: client certificate %s / key %s: %w", a.cfgSrc, rel(cfg.Cert), rel(cfg.Key), err)
	}
	if a.leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
		return nil, fmt.Errorf("client config %s: client certificate %s: %w", a.cfgSrc, rel(cfg.Cert), err)
	}
	a.target = cfg.Endpoint
	if a.Endpoint != "" {
		a.target = a.Endpoint
	}
	if a.target == "" {
		return nil, fmt.Errorf("no endpoint: set endpoint in %s or pass --endpoint HOST:PORT", a.cfgSrc)
	}
	host, _, err := net.SplitHostPort(a.target)
	if err != nil {
		return nil, fmt.Errorf("endpoint %q: want HOST:PORT", a.target)
	}
	var warnOnce sync.Once
	tlsCfg := &tls.Config{Certificates: []tls.Certificate{cert}, ServerName: host, MinVersion: tls.VersionTLS13,
		// Verified in VerifyConnection against the config's CA and the
		// roots a CA rotation chained to it (pki.ServerRoots).
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection
		VerifyConnection: func(cs tls.ConnectionState) error {
			if err := verifyServer(cs.PeerCertificates, cas, host, time.Now()); err != nil {
				return err
			}
			if w := expiryWarning(cs.PeerCertificates[0], time.Now()); w != "" {
				warnOnce.Do(func() { fmt.Fprintln(a.Stderr, w) })
			}
			return nil
		}}
	conn, err := grpc.NewClient(a.target, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", a.target, err)
	}
	a.conn, a.client = conn, v1.NewAdminServiceClient(conn)
	return a.client, nil
}

// serverCertWarnBefore is how long before the server certificate expires
// every command warns (tetherd logs it too).
const serverCertWarnBefore = 30 * 24 * time.Hour

// expiryWarning is the line a command prints when tetherd's certificate
// is within serverCertWarnBefore of expiry ("" otherwise). It never stops
// the command: the certificate is still valid, and the operator may be
// running this very command to fix it.
func expiryWarning(leaf *x509.Certificate, now time.Time) string {
	left := leaf.NotAfter.Sub(now)
	if left >= serverCertWarnBefore {
		return ""
	}
	return fmt.Sprintf("warning: tetherd's server certificate expires on %s (in %d days): run `tetherd renew-server-cert --data-dir DIR` on the control plane; it is picked up without a restart",
		leaf.NotAfter.UTC().Format("2006-01-02"), int(left.Hours()/24))
}

// parseCerts reads every certificate of a PEM file.
func parseCerts(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var b *pem.Block
		if b, data = pem.Decode(data); b == nil {
			return out, nil
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
}

// verifyServer checks tetherd's chain against the client config's CAs and
// any root a presented cross certificate chains to them: after a CA
// rotation's activate the server's leaf is signed by the new CA, and a
// config written before it still works (design §3.10).
func verifyServer(presented, cas []*x509.Certificate, host string, now time.Time) error {
	if len(presented) == 0 {
		return errors.New("tetherd presented no certificate")
	}
	trusted := map[string]bool{}
	for _, c := range cas {
		trusted[pki.Fingerprint(c.Raw)] = true
	}
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range pki.ServerRoots(presented, trusted, cas, now) {
		roots.AddCert(r)
	}
	for _, c := range presented[1:] {
		inter.AddCert(c)
	}
	if _, err := presented[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: host, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return fmt.Errorf("tetherd's certificate does not verify against the client config's CA: %w", err)
	}
	return nil
}
