package tetherctl

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// Files `identity create` writes, as `tetherd init` does for the first admin.
const (
	identityCertFile   = "admin.crt"
	identityKeyFile    = "admin.key"
	identityCAFile     = "ca.crt"
	identityConfigFile = "tetherconfig.yaml"
)

// newIdentityKey makes the identity's key here: it never leaves this
// machine; the control plane signs a CSR.
func newIdentityKey() (*ecdsa.PrivateKey, string, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, "", nil, fmt.Errorf("generate key: %w", err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return nil, "", nil, fmt.Errorf("make CSR: %w", err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, "", nil, fmt.Errorf("encode key: %w", err)
	}
	return key, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

func ttlSeconds(d time.Duration) (int64, error) {
	if d < 0 {
		return 0, fmt.Errorf("--ttl %s: must not be negative", d)
	}
	return int64(d / time.Second), nil
}

func (a *App) identityCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "identity", Short: "Operator identities (viewer, operator, admin)"}
	var role, out string
	var ttl time.Duration
	create := &cobra.Command{
		Use: "create NAME --role viewer|operator|admin --out DIR", Short: "Mint an identity and write its client config into DIR (admin)", Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if out == "" {
				return fmt.Errorf("--out DIR is required")
			}
			secs, err := ttlSeconds(ttl)
			if err != nil {
				return err
			}
			if _, err := os.Stat(filepath.Join(out, identityConfigFile)); err == nil {
				return fmt.Errorf("--out %s already holds a client config; choose an empty directory", out)
			}
			_, csr, keyPEM, err := newIdentityKey()
			if err != nil {
				return err
			}
			resp, err := invoke(a, v1.AdminServiceClient.CreateIdentity, &v1.CreateIdentityRequest{Name: args[0], Role: role, CsrPem: csr, TtlSeconds: secs})
			if err != nil {
				return err
			}
			if err := os.MkdirAll(out, 0o700); err != nil {
				return fmt.Errorf("--out: %w", err)
			}
			for _, f := range []struct {
				name string
				data []byte
				perm os.FileMode
			}{{identityKeyFile, keyPEM, 0o600}, {identityCertFile, []byte(resp.CertificatePem), 0o644}, {identityCAFile, []byte(resp.CaPem), 0o644}} {
				if err := writeNew(filepath.Join(out, f.name), f.data, f.perm); err != nil {
					return err
				}
			}
			cfg, err := yaml.Marshal(clientConfig{Endpoint: a.target, CA: identityCAFile, Cert: identityCertFile, Key: identityKeyFile})
			if err != nil {
				return err
			}
			header := fmt.Sprintf("# tetherctl configuration for identity %s (role %s), valid until %s.\n# Use it with: tetherctl --config %s ...\n",
				args[0], role, resp.Identity.NotAfter.AsTime().UTC().Format(time.RFC3339), filepath.Join(out, identityConfigFile))
			if err := writeNew(filepath.Join(out, identityConfigFile), append([]byte(header), cfg...), 0o600); err != nil {
				return err
			}
			return a.print(resp.Identity, func(w *tabwriter.Writer) {
				identityRows(w, resp.Identity)
				row(w, "config:", filepath.Join(out, identityConfigFile))
			})
		},
	}
	create.Flags().StringVar(&role, "role", "", "viewer, operator or admin")
	create.Flags().DurationVar(&ttl, "ttl", 0, "the identity's lifetime (default 90 days); `identity renew` rotates its key within it and cannot extend it")
	create.Flags().StringVar(&out, "out", "", "directory for the key, certificate and client config")
	_ = create.MarkFlagRequired("role")

	list := &cobra.Command{Use: "list", Short: "List identities (admin)", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error {
		return call(a, v1.AdminServiceClient.ListIdentities, &v1.ListIdentitiesRequest{}, func(w *tabwriter.Writer, resp *v1.ListIdentitiesResponse) {
			row(w, "NAME", "ROLE", "SERIAL", "NOT AFTER", "REVOKED")
			for _, id := range resp.Identities {
				row(w, id.Name, id.Role, id.Serial, when(id.NotAfter), when(id.RevokedAt))
			}
		})
	}}
	revoke := &cobra.Command{Use: "revoke NAME", Short: "Revoke an identity; its next call is refused (admin)", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		return call(a, v1.AdminServiceClient.RevokeIdentity, &v1.RevokeIdentityRequest{Name: args[0]}, identityRows)
	}}
	var rttl time.Duration
	renew := &cobra.Command{Use: "renew", Short: "Renew this client config's own certificate (new key, same name and role)", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error {
		secs, err := ttlSeconds(rttl)
		if err != nil {
			return err
		}
		c, err := a.dial()
		if err != nil {
			return err
		}
		certPath, keyPath, err := a.identityFiles()
		if err != nil {
			return err
		}
		_, csr, keyPEM, err := newIdentityKey()
		if err != nil {
			return err
		}
		ctx, cancel := a.ctx()
		defer cancel()
		resp, err := c.RenewIdentity(ctx, &v1.RenewIdentityRequest{CsrPem: csr, TtlSeconds: secs})
		if err != nil {
			return err
		}
		// Key first, then certificate, each replaced whole: a crash in
		// between leaves a pair that fails to load, never a torn file.
		if err := replaceFile(keyPath, keyPEM, 0o600); err != nil {
			return err
		}
		if err := replaceFile(certPath, []byte(resp.CertificatePem), 0o644); err != nil {
			return err
		}
		return a.print(resp.Identity, func(w *tabwriter.Writer) {
			identityRows(w, resp.Identity)
			row(w, "written:", certPath+", "+keyPath)
		})
	}}
	renew.Flags().DurationVar(&rttl, "ttl", 0, "certificate lifetime (default 90 days), cut to what the admin granted: a renewal ends no later than the certificate renewing")
	cmd.AddCommand(create, list, revoke, renew)
	return cmd
}

func identityRows(w *tabwriter.Writer, id *v1.AdminIdentity) {
	row(w, "identity:", id.Name)
	row(w, "role:", id.Role)
	row(w, "serial:", id.Serial)
	row(w, "not after:", when(id.NotAfter))
	if id.RevokedAt != nil {
		row(w, "revoked:", when(id.RevokedAt))
	}
}

// identityFiles are the certificate and key paths of the client config in use.
func (a *App) identityFiles() (string, string, error) {
	path, _ := a.configPath()
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", "", fmt.Errorf("read client config %s: %w", path, err)
	}
	var cfg clientConfig
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		return "", "", fmt.Errorf("parse client config %s: %w", path, err)
	}
	rel := func(p string) string {
		if filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(filepath.Dir(path), p)
	}
	return rel(cfg.Cert), rel(cfg.Key), nil
}

func replaceFile(path string, data []byte, perm os.FileMode) error {
	tmp := path + ".new"
	_ = os.Remove(tmp)
	if err := writeNew(tmp, data, perm); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("replace %s: %w", path, err)
	}
	return nil
}
