package enroll

import (
	"crypto/ed25519"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/tetherfleet/tether/pki"
)

// File names in the state directory.
const (
	KeyFile      = "node.key"
	CertFile     = "node.crt"
	CAFile       = "ca.crt"
	IdentityFile = "identity.json"
	// BundleFile holds the roots a trust bundle chained to the pin, each
	// with its cross certificate, checked again at every load.
	BundleFile = "bundle.json"
)

// ErrNoIdentity means the state directory holds no saved identity.
var ErrNoIdentity = errors.New("no saved identity")

// store keeps the node's key, certificate and CA in a directory readable
// only by the agent (0700, files 0600). The default /run/tether is a tmpfs
// that survives the switch of root (the agent moves /run into the new
// root), which is how the agent started by the new root's init finds it.
type store struct {
	Dir string
}

// savedMeta is identity.json.
type savedMeta struct {
	InstanceID    string    `json:"instance_id"`
	URL           string    `json:"url"`
	CAFingerprint string    `json:"ca_fingerprint"`
	NotAfter      time.Time `json:"not_after"`
	// SpentTokenHashes are pki.HashToken of every token this node has
	// enrolled with, so a rediscovered token can be told apart from a fresh
	// one without keeping the secret.
	SpentTokenHashes []string `json:"spent_token_hashes,omitempty"`
}

func (s store) path(name string) string { return filepath.Join(s.Dir, name) }

// ensureDir creates the state directory 0700, and tightens it if it exists.
func (s store) ensureDir() error {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	if err := os.Chmod(s.Dir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	return nil
}

// save writes the identity. Each file is replaced atomically; key and
// certificate are two renames, so load checks that they belong together.
func (s store) save(id *Identity, meta savedMeta) error {
	if err := s.ensureDir(); err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(id.Key)
	if err != nil {
		return fmt.Errorf("marshal key: %w", err)
	}
	metaJSON, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return err
	}
	files := []struct {
		name string
		data []byte
	}{
		{CAFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: id.CA.Raw})},
		{KeyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})},
		{CertFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: id.Cert.Raw})},
		{IdentityFile, append(metaJSON, '\n')},
	}
	for _, f := range files {
		if err := WriteFileAtomic(s.path(f.name), f.data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// loadMeta reads identity.json alone (no key material).
func (s store) loadMeta() (savedMeta, error) {
	var meta savedMeta
	b, err := os.ReadFile(s.path(IdentityFile))
	if errors.Is(err, fs.ErrNotExist) {
		return meta, ErrNoIdentity
	}
	if err != nil {
		return meta, err
	}
	if err := json.Unmarshal(b, &meta); err != nil {
		return meta, fmt.Errorf("%s: %w", s.path(IdentityFile), err)
	}
	return meta, nil
}

// keepCorrupt moves an unreadable metadata file aside, so the next save
// does not erase what went wrong, and says where it went.
func (s store) keepCorrupt() string {
	to := s.path(IdentityFile) + ".corrupt"
	if err := os.Rename(s.path(IdentityFile), to); err != nil {
		return "could not keep it: " + err.Error()
	}
	return "kept as " + to
}

// load reads and cross-checks a saved identity.
func (s store) load() (*Identity, savedMeta, error) {
	meta, err := s.loadMeta()
	if err != nil {
		return nil, meta, err
	}
	keyPEM, err := os.ReadFile(s.path(KeyFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, meta, ErrNoIdentity
	}
	if err != nil {
		return nil, meta, err
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, meta, fmt.Errorf("%s: %w", s.path(KeyFile), err)
	}
	cert, err := readCert(s.path(CertFile))
	if err != nil {
		return nil, meta, err
	}
	ca, err := readCert(s.path(CAFile))
	if err != nil {
		return nil, meta, err
	}
	id, err := newIdentity(key, cert, ca)
	if err != nil {
		return nil, meta, fmt.Errorf("saved identity in %s: %w", s.Dir, err)
	}
	return id, meta, nil
}

func parseKey(b []byte) (ed25519.PrivateKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "PRIVATE KEY" {
		return nil, errors.New("no PRIVATE KEY block")
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, err
	}
	ek, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("key is %T, want Ed25519", k)
	}
	return ek, nil
}

func readCert(path string) (*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNoIdentity
	}
	if err != nil {
		return nil, err
	}
	c, err := parseCertPEM(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

func parseCertPEM(b []byte) (*x509.Certificate, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("no CERTIFICATE block")
	}
	return x509.ParseCertificate(blk.Bytes)
}

// WriteFileAtomic writes data to a temporary file beside path, syncs it and
// renames it over path, so a reader (or a crash) never sees half a file.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := f.Chmod(perm); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// savedRoot is one entry of bundle.json.
type savedRoot struct {
	Root  string `json:"root_pem"`
	Cross string `json:"cross_pem,omitempty"`
}

// savedBundle is bundle.json: every entry accepted (the chains from the
// pin) and the fingerprints trusted now.
type savedBundle struct {
	Entries []savedRoot `json:"entries"`
	Trusted []string    `json:"trusted"`
}

func (s store) saveBundle(roots []pki.BundleRoot, trusted []string) error {
	if err := s.ensureDir(); err != nil {
		return err
	}
	out := savedBundle{Trusted: trusted}
	for _, r := range roots {
		sr := savedRoot{Root: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: r.Root.Raw}))}
		if r.Cross != nil {
			sr.Cross = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: r.Cross.Raw}))
		}
		out.Entries = append(out.Entries, sr)
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	return WriteFileAtomic(s.path(BundleFile), append(b, '\n'), 0o600)
}

// loadBundle reads bundle.json; none is an empty bundle.
func (s store) loadBundle() ([]pki.BundleRoot, []string, error) {
	b, err := os.ReadFile(s.path(BundleFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	var saved savedBundle
	if err := json.Unmarshal(b, &saved); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", s.path(BundleFile), err)
	}
	out := make([]pki.BundleRoot, 0, len(saved.Entries))
	for _, sr := range saved.Entries {
		root, err := parseCertPEM([]byte(sr.Root))
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", s.path(BundleFile), err)
		}
		r := pki.BundleRoot{Root: root}
		if sr.Cross != "" {
			if r.Cross, err = parseCertPEM([]byte(sr.Cross)); err != nil {
				return nil, nil, fmt.Errorf("%s: %w", s.path(BundleFile), err)
			}
		}
		out = append(out, r)
	}
	return out, saved.Trusted, nil
}
