package daemon

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tetherfleet/tether/controlplane/audit"
	"github.com/tetherfleet/tether/controlplane/carotation"
	"github.com/tetherfleet/tether/controlplane/certreload"
	"github.com/tetherfleet/tether/controlplane/credentials"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/netboot"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/pki/ca"
)

// openDataDir opens what `tetherd init` laid out and what earlier runs
// left: the CA, the server certificate, the store (recording a restore
// and the init admin in it), the credentials key, the blob store, the
// module signing keys and the default netboot artifacts.
func (d *daemon) openDataDir(ctx context.Context) error {
	o, log := &d.o, d.log
	var err error
	if d.authority, err = ca.Load(filepath.Join(o.DataDir, CADir), o.Clock); err != nil {
		return fmt.Errorf("serve: %w (run `tetherd init --data-dir %s` first)", err, o.DataDir)
	}
	if d.serverCert, err = certreload.New(filepath.Join(o.DataDir, ServerCertFile), filepath.Join(o.DataDir, ServerKeyFile), o.Clock, log); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	st, err := OpenStore(ctx, o.Store, o.DataDir, log)
	if err != nil {
		return err
	}
	if o.Test.WrapStore != nil {
		st = o.Test.WrapStore(st)
	}
	// Every write of an audited admin call appends its audit record in
	// the same transaction (controlplane/audit).
	if !o.Test.DisableAudit {
		st = audit.Wrap(st)
	}
	d.st = st
	if err := recordRestore(ctx, st, o.DataDir, o.Clock.Now(), log); err != nil {
		return err
	}
	if err := adoptInitAdmin(ctx, st, d.authority, o.DataDir, o.Clock.Now(), log); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	var created bool
	if d.sealer, created, err = credentials.LoadOrCreateKey(o.DataDir); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if created {
		log.Info("created the BMC credentials key (this data dir predates stored credentials); copy it to every replica's data dir",
			"file", filepath.Join(o.DataDir, credentials.KeyFile))
	}
	// The data dir's CA: the first of the rotation set, and the issuer of
	// the server certificate, whatever CA is active (design §3.10).
	d.cas = &carotation.Service{Store: st, CA: d.authority, First: d.authority.Certificate(), FirstKey: d.authority.Key(),
		Sealer: d.sealer, Clock: o.Clock, Log: log}
	if err := d.cas.Start(ctx); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if d.blobs, err = modules.OpenBlobs(filepath.Join(o.DataDir, BlobDir)); err != nil {
		return err
	}
	if n, err := d.blobs.SweepTmp(time.Hour, o.Clock.Now()); err != nil {
		log.Warn("removing uploads left by an interrupted push", "err", err)
	} else if n > 0 {
		log.Info("removed uploads left by an interrupted push", "count", n)
	}
	if d.signingKeys, err = loadSigningKeys(o.SigningKeyFiles); err != nil {
		return err
	}
	if d.kernel, err = ingestArtifact(d.blobs, "--kernel", o.Kernel); err != nil {
		return err
	}
	if d.initramfs, err = ingestArtifact(d.blobs, "--initramfs", o.Initramfs); err != nil {
		return err
	}
	if d.ukis, err = netboot.LoadUKIs(d.blobs, o.UKIs); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// OpenStore opens the store a --store value names.
func OpenStore(ctx context.Context, spec, dataDir string, log *slog.Logger) (store.Store, error) {
	switch {
	case spec == "" || spec == "sqlite":
		path := filepath.Join(dataDir, SQLiteFile)
		if err := privateSQLite(dataDir, path); err != nil {
			return nil, fmt.Errorf("serve: %w", err)
		}
		s, err := sqlite.Open(ctx, path)
		if err != nil {
			return nil, fmt.Errorf("serve: %w", err)
		}
		return s, nil
	case strings.HasPrefix(spec, "postgres://"), strings.HasPrefix(spec, "postgresql://"):
		return openPostgres(ctx, spec, log)
	default:
		return nil, fmt.Errorf("serve: --store %q: want sqlite or a postgres:// URL", spec)
	}
}

func loadSigningKeys(files []string) ([][]byte, error) {
	var out [][]byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("module signing key: %w", err)
		}
		key, err := ParseSigningKey(b)
		if err != nil {
			return nil, fmt.Errorf("module signing key %s: %w", f, err)
		}
		out = append(out, key)
	}
	return out, nil
}

func edKeys(keys [][]byte) []ed25519.PublicKey {
	out := make([]ed25519.PublicKey, len(keys))
	for i, k := range keys {
		out[i] = k
	}
	return out
}

// ParseSigningKey accepts a raw 32-byte Ed25519 public key or a PEM/PKIX one.
func ParseSigningKey(b []byte) (ed25519.PublicKey, error) {
	if len(b) == ed25519.PublicKeySize {
		return ed25519.PublicKey(b), nil
	}
	pub, err := parsePKIXEd25519(b)
	if err != nil {
		return nil, err
	}
	return pub, nil
}
