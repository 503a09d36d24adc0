package daemon

import (
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/tetherfleet/tether/controlplane/certificates"
	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/pki"
	"github.com/tetherfleet/tether/pki/ca"
)

// InitAdminFile records, in the data dir, the certificate `tetherd init`
// (or `init --rotate-admin`) last issued to the admin identity. init has
// no store to write to (the store may be a PostgreSQL server serve is
// told of), so serve adopts the certificate at start-up: it becomes an
// identity like any other, that `identity revoke admin` and `cert revoke`
// find. The certificate is public; the key stays in the admin dir.
const InitAdminFile = "init-admin.crt"

// InitAdminName is the identity `tetherd init` mints.
const InitAdminName = "admin"

// RotateAdmin issues a new admin identity certificate and key into an
// existing data dir's admin dir, replacing the old pair. The next start of
// tetherd serve adopts it and revokes every certificate the admin identity
// held before (ADR 0018): this is how a revoked or lost admin is replaced.
func RotateAdmin(o InitOptions) error {
	if o.DataDir == "" {
		return errors.New("init --rotate-admin: --data-dir is required")
	}
	o.defaults()
	authority, err := ca.Load(filepath.Join(o.DataDir, CADir), o.Clock)
	if err != nil {
		return fmt.Errorf("init --rotate-admin: %w (is %s a data dir made by `tetherd init`?)", err, o.DataDir)
	}
	adminDir := filepath.Join(o.DataDir, AdminDir)
	if err := os.MkdirAll(adminDir, 0o700); err != nil {
		return fmt.Errorf("init --rotate-admin: %w", err)
	}
	if err := writeAdmin(adminDir, authority, true); err != nil {
		return fmt.Errorf("init --rotate-admin: %w", err)
	}
	if err := writeClientFiles(o, adminDir, authority, true); err != nil {
		return fmt.Errorf("init --rotate-admin: %w", err)
	}
	return recordInitAdmin(o.DataDir, adminDir, true)
}

// writeAdmin signs a fresh admin certificate for a new key. With replace,
// the old pair is replaced through renames, key first, so that a reader
// never finds a new certificate beside an old key.
func writeAdmin(adminDir string, authority *ca.CA, replace bool) error {
	sign := func(k *ecdsa.PrivateKey) ([]byte, error) {
		c, err := authority.SignAdmin(InitAdminName, "admin", k.Public(), 0)
		if err != nil {
			return nil, err
		}
		return ca.CertPEM(c), nil
	}
	if !replace {
		return issue(adminDir, AdminCertFile, AdminKeyFile, sign)
	}
	for _, f := range []string{AdminCertFile, AdminKeyFile} {
		if err := os.Remove(filepath.Join(adminDir, f+".new")); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := issue(adminDir, AdminCertFile+".new", AdminKeyFile+".new", sign); err != nil {
		return err
	}
	for _, f := range []string{AdminKeyFile, AdminCertFile} {
		if err := os.Rename(filepath.Join(adminDir, f+".new"), filepath.Join(adminDir, f)); err != nil {
			return err
		}
	}
	return nil
}

// recordInitAdmin copies the admin certificate to InitAdminFile, where
// serve adopts it.
func recordInitAdmin(dataDir, adminDir string, replace bool) error {
	pemBytes, err := os.ReadFile(filepath.Join(adminDir, AdminCertFile))
	if err != nil {
		return err
	}
	path := filepath.Join(dataDir, InitAdminFile)
	if !replace {
		return ca.WriteFileExclusive(path, pemBytes, 0o600)
	}
	tmp := path + ".new"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := ca.WriteFileExclusive(tmp, pemBytes, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// adoptInitAdmin records the certificate `tetherd init` issued as the
// admin identity's, once. A certificate already recorded is left alone.
// One that is new replaces the identity's certificate and revokes every
// certificate the identity held before: only `init --rotate-admin`, run by
// whoever holds the data dir (and so the CA key), writes a new one.
//
// A data dir from before InitAdminFile has only the admin dir's copy; it is
// adopted only while no identity has the name, since an admin may have
// minted an "admin" identity through the API in the meantime.
func adoptInitAdmin(ctx context.Context, st store.Store, authority *ca.CA, dataDir string, now time.Time, log *slog.Logger) error {
	path, legacy := filepath.Join(dataDir, InitAdminFile), false
	pemBytes, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		path, legacy = filepath.Join(dataDir, AdminDir, AdminCertFile), true
		pemBytes, err = os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("adopt the init admin certificate: %w", err)
	}
	cert, err := ca.ParseCertificatePEM(pemBytes)
	if err != nil {
		return fmt.Errorf("adopt the init admin certificate %s: %w", path, err)
	}
	id, err := authority.Verify(cert, x509.ExtKeyUsageClientAuth)
	if err != nil {
		log.Warn("the admin certificate `tetherd init` issued is not valid; it is not recorded (mint a new one with `tetherd init --rotate-admin`)",
			"file", path, "err", err)
		return nil
	}
	if id.Kind != pki.KindAdmin {
		return fmt.Errorf("adopt the init admin certificate %s: it is a %s certificate, not an admin's", path, id.Kind)
	}
	serial := store.CertSerial(ca.SerialString(cert))
	var revoked []store.CertSerial
	adopted := false
	err = st.Tx(ctx, func(q store.Queries) error {
		revoked, adopted = nil, false
		if _, err := q.GetCertificate(ctx, serial); err == nil {
			return nil
		} else if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		prev, err := q.GetAdminIdentity(ctx, id.Name)
		taken := false
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			return err
		case legacy:
			log.Warn("the admin certificate from `tetherd init` is recorded, but an identity of that name exists already: revoke the certificate by serial, or replace both with `tetherd init --rotate-admin`",
				"identity", id.Name, "serial", serial)
			taken = true
		default:
			// A rotation: every certificate the identity held goes first,
			// before the new one is recorded under the same subject.
			if revoked, err = certificates.RevokeIdentity(ctx, q, prev, "admin identity "+prev.Name+" rotated by tetherd init --rotate-admin", now); err != nil {
				return err
			}
		}
		if err := q.CreateCertificate(ctx, &store.Certificate{Serial: serial, Kind: pki.KindAdmin, Subject: id.String(),
			Issuer: pki.Fingerprint(authority.IssuerOf(cert).Raw), NotBefore: cert.NotBefore, NotAfter: cert.NotAfter, CreatedAt: now}); err != nil {
			return err
		}
		if taken {
			return nil
		}
		if err := q.PutAdminIdentity(ctx, &store.AdminIdentity{Name: id.Name, Role: store.Role(id.Role), Serial: serial, NotAfter: cert.NotAfter, CreatedAt: now}); err != nil {
			return err
		}
		adopted = true
		if _, err := (events.E{Kind: events.CertIssued, Message: "admin identity " + id.Name + " (" + id.Role + ") certificate " + serial.String() + " recorded from tetherd init",
			Payload: events.IdentityIssuedPayload{By: "tetherd init", Identity: id.Name, Role: store.Role(id.Role), Serial: serial}}).Write(ctx, q, now); err != nil {
			return err
		}
		if len(revoked) > 0 {
			if _, err := (events.E{Kind: events.CertRevoked, Severity: events.Medium,
				Message: "admin identity " + id.Name + " rotated: its earlier certificates are revoked",
				Payload: events.IdentityRotatedPayload{By: "tetherd init --rotate-admin", Identity: id.Name, Serials: revoked}}).Write(ctx, q, now); err != nil {
				return err
			}
		}
		for _, s := range revoked {
			if err := q.Notify(ctx, store.ChannelRevocations, s.String()); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("adopt the init admin certificate: %w", err)
	}
	if adopted {
		log.Info("recorded the admin identity from tetherd init", "identity", id.Name, "serial", serial, "revoked_earlier", len(revoked))
	}
	return nil
}
