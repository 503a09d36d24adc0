// Package daemon is tetherd: `init` lays out a data dir with the CA, the
// server certificate and an admin identity; `serve` runs the control plane.
package daemon

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"fmt"
	"github.com/tetherfleet/tether/controlplane/credentials"
	"os"
	"path/filepath"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/pki/ca"
)

// Layout of a data dir.
const (
	CADir          = "ca"
	ServerCertFile = "server.crt"
	ServerKeyFile  = "server.key"
	AdminDir       = "admin"
	AdminCertFile  = "admin.crt"
	AdminKeyFile   = "admin.key"
	AdminCAFile    = "ca.crt"
	ClientConfig   = "tetherconfig.yaml"
	SQLiteFile     = "tether.db"
	BlobDir        = "blobs"
	MachineDir     = "machines"
)

// DefaultAdvertise are the names the server certificate always carries:
// loopback, and 10.0.2.2, the address a QEMU user-networking guest uses
// to reach the host.
var DefaultAdvertise = []string{"localhost", "127.0.0.1", "::1", "10.0.2.2"}

// InitOptions configure Init.
type InitOptions struct {
	DataDir string
	// Advertise adds host names or addresses to the server certificate.
	Advertise []string
	// Endpoint is written into the admin client config.
	Endpoint string
	// CAKey is the CA key type: "" or p256 (the default), or ed25519.
	CAKey string
	// RotateAdmin replaces only the admin identity of an existing data
	// dir (`tetherd init --rotate-admin`).
	RotateAdmin bool
	Clock       clock.Clock
}

// ClientConfigFile is tetherctl's configuration: the endpoint and the
// admin identity. Relative paths are relative to the file.
type ClientConfigFile struct {
	Endpoint string `yaml:"endpoint"`
	CA       string `yaml:"ca"`
	Cert     string `yaml:"cert"`
	Key      string `yaml:"key"`
}

// Init creates the CA, the server certificate and the admin identity. It
// refuses to touch a data dir that already has a CA; with RotateAdmin set
// it only replaces the admin identity (RotateAdmin).
func Init(o InitOptions) error {
	if o.RotateAdmin {
		return RotateAdmin(o)
	}
	if o.DataDir == "" {
		return errors.New("init: --data-dir is required")
	}
	o.defaults()
	kt, err := ca.ParseKeyType(o.CAKey)
	if err != nil {
		return fmt.Errorf("init: --ca-key: %w", err)
	}
	if err := makePrivateDir(o.DataDir); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	authority, err := ca.CreateWithKey(filepath.Join(o.DataDir, CADir), "Tether CA", o.Clock, kt)
	if errors.Is(err, ca.ErrExists) {
		return fmt.Errorf("init: %s already has a CA; refusing to overwrite it (remove the data dir to start over, or replace only the admin identity with --rotate-admin): %w", o.DataDir, err)
	}
	if err != nil {
		return fmt.Errorf("init: %w", err)
	}
	// The key that seals BMC credentials stays in the data dir, beside the CA.
	if _, _, err := credentials.LoadOrCreateKey(o.DataDir); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	hosts := append(append([]string{}, DefaultAdvertise...), o.Advertise...)
	if err := issue(o.DataDir, ServerCertFile, ServerKeyFile, func(k *ecdsa.PrivateKey) ([]byte, error) {
		c, err := authority.SignServer(hosts, k.Public())
		if err != nil {
			return nil, err
		}
		// The chain includes the CA so agents can pin its fingerprint.
		return append(ca.CertPEM(c), authority.CertificatePEM()...), nil
	}); err != nil {
		return fmt.Errorf("init: server certificate: %w", err)
	}
	adminDir := filepath.Join(o.DataDir, AdminDir)
	if err := os.MkdirAll(adminDir, 0o700); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	if err := writeAdmin(adminDir, authority, false); err != nil {
		return fmt.Errorf("init: admin certificate: %w", err)
	}
	if err := recordInitAdmin(o.DataDir, adminDir, false); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	if err := writeClientFiles(o, adminDir, authority, false); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	return nil
}

func (o *InitOptions) defaults() {
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Endpoint == "" {
		o.Endpoint = "127.0.0.1:7443"
	}
}

// writeClientFiles writes the CA certificate and tetherctl's config beside
// the admin key. With keep, files already there stay (a rotation keeps the
// config an operator may have edited).
func writeClientFiles(o InitOptions, adminDir string, authority *ca.CA, keep bool) error {
	exists := func(name string) bool {
		_, err := os.Stat(filepath.Join(adminDir, name))
		return keep && err == nil
	}
	if !exists(AdminCAFile) {
		if err := ca.WriteFileExclusive(filepath.Join(adminDir, AdminCAFile), authority.CertificatePEM(), 0o644); err != nil {
			return err
		}
	}
	if exists(ClientConfig) {
		return nil
	}
	cfg, err := yaml.Marshal(ClientConfigFile{Endpoint: o.Endpoint, CA: AdminCAFile, Cert: AdminCertFile, Key: AdminKeyFile})
	if err != nil {
		return fmt.Errorf("client config: %w", err)
	}
	header := "# tetherctl configuration, written by `tetherd init` on " + o.Clock.Now().UTC().Format(time.RFC3339) + ".\n" +
		"# Use it with: tetherctl --config " + filepath.Join(adminDir, ClientConfig) + " ...\n" +
		"# or: export TETHERCONFIG=" + filepath.Join(adminDir, ClientConfig) + "\n"
	return ca.WriteFileExclusive(filepath.Join(adminDir, ClientConfig), append([]byte(header), cfg...), 0o600)
}

// issue makes a P-256 key (grpcurl, openssl and every TLS stack take it)
// and writes it 0600 with the certificate sign returns.
func issue(dir, certFile, keyFile string, sign func(*ecdsa.PrivateKey) ([]byte, error)) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	certPEM, err := sign(key)
	if err != nil {
		return err
	}
	keyPEM, err := ca.KeyPEM(key)
	if err != nil {
		return err
	}
	if err := ca.WriteFileExclusive(filepath.Join(dir, keyFile), keyPEM, 0o600); err != nil {
		return err
	}
	return ca.WriteFileExclusive(filepath.Join(dir, certFile), certPEM, 0o644)
}
