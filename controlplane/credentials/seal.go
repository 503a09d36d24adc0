// Package credentials keeps the secrets the control plane uses to drive
// machines: BMC user names and passwords. A password is sealed with
// AES-256-GCM under a key kept in the data dir (never in the store), with
// the credential's name as additional data so a sealed password cannot be
// moved to another credential's row. Nothing here returns a password to a
// caller of the API: only the control plane's own BMC resolver opens one.
package credentials

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// KeyFile is the sealing key's file in the data dir.
const KeyFile = "credentials.key"

const (
	keySize = 32
	// sealVersion starts every sealed value, so the format can change.
	sealVersion byte = 1
)

// Sealer seals and opens passwords.
type Sealer struct {
	aead cipher.AEAD
}

// NewSealer returns a sealer for a 32-byte key.
func NewSealer(key []byte) (*Sealer, error) {
	if len(key) != keySize {
		return nil, fmt.Errorf("credentials key: %d bytes, want %d", len(key), keySize)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("credentials key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("credentials key: %w", err)
	}
	return &Sealer{aead: aead}, nil
}

// LoadOrCreateKey reads dir's key, creating it (0600) when there is none:
// `tetherd init` makes it, and the first serve of a data dir older than
// credentials does. created says whether it was made now.
func LoadOrCreateKey(dir string) (s *Sealer, created bool, err error) {
	path := filepath.Join(dir, KeyFile)
	key, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		key = make([]byte, keySize)
		if _, err := rand.Read(key); err != nil {
			return nil, false, fmt.Errorf("credentials key: %w", err)
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			// Another process made it first: use that one.
			return LoadOrCreateKey(dir)
		}
		if err != nil {
			return nil, false, fmt.Errorf("credentials key: %w", err)
		}
		if _, err := f.Write(key); err != nil {
			f.Close()
			os.Remove(path)
			return nil, false, fmt.Errorf("credentials key %s: %w", path, err)
		}
		if err := f.Close(); err != nil {
			os.Remove(path)
			return nil, false, fmt.Errorf("credentials key %s: %w", path, err)
		}
		created = true
	} else if err != nil {
		return nil, false, fmt.Errorf("credentials key: %w", err)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		return nil, false, fmt.Errorf("credentials key %s is readable by others (mode %v); chmod 600 it", path, fi.Mode().Perm())
	}
	s, err = NewSealer(key)
	if err != nil {
		return nil, false, fmt.Errorf("%s: %w", path, err)
	}
	return s, created, nil
}

func aad(name string) []byte { return []byte("tether-credential:" + name) }

// Seal encrypts the password of credential name.
func (s *Sealer) Seal(name string, password []byte) ([]byte, error) {
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("seal credential %q: %w", name, err)
	}
	out := append([]byte{sealVersion}, nonce...)
	return s.aead.Seal(out, nonce, password, aad(name)), nil
}

// Open decrypts the password of credential name.
func (s *Sealer) Open(name string, sealed []byte) ([]byte, error) {
	ns := s.aead.NonceSize()
	if len(sealed) < 1+ns+s.aead.Overhead() || sealed[0] != sealVersion {
		return nil, fmt.Errorf("credential %q: the sealed password is not in a format this control plane reads", name)
	}
	pw, err := s.aead.Open(nil, sealed[1:1+ns], sealed[1+ns:], aad(name))
	if err != nil {
		return nil, fmt.Errorf("credential %q: cannot open its password with this data dir's %s (a different key, or a damaged row)", name, KeyFile)
	}
	return pw, nil
}
