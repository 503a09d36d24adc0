package backup

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"filippo.io/age"
)

// ageMagic opens every age file.
const ageMagic = "age-encryption.org/v1"

// Decryption opens an encrypted archive.
type Decryption struct {
	Passphrase string
	// Identities are age identities (AGE-SECRET-KEY-1...), one a line.
	Identities string
}

func (d Decryption) identities() ([]age.Identity, error) {
	var out []age.Identity
	if d.Passphrase != "" {
		id, err := age.NewScryptIdentity(d.Passphrase)
		if err != nil {
			return nil, fmt.Errorf("restore: passphrase: %w", err)
		}
		out = append(out, id)
	}
	if strings.TrimSpace(d.Identities) != "" {
		ids, err := age.ParseIdentities(strings.NewReader(d.Identities))
		if err != nil {
			return nil, fmt.Errorf("restore: identities: %w", err)
		}
		out = append(out, ids...)
	}
	return out, nil
}

// RestoreOptions bound what a restore accepts.
type RestoreOptions struct {
	// MaxSchema is the newest database schema this build knows; a backup
	// of a newer one is refused (it would not open, or worse, half work).
	MaxSchema int
	Now       func() time.Time
	Progress  func(done, total int64, name string)
}

// Marker is what a restore leaves in the data dir for tetherd's first
// start on it.
type Marker struct {
	BackupCreated time.Time `json:"backup_created_at"`
	Restored      time.Time `json:"restored_at"`
	CAFingerprint string    `json:"ca_fingerprint,omitempty"`
	KeysOnly      bool      `json:"keys_only"`
	MissingBlobs  []string  `json:"missing_blobs,omitempty"`
}

// Open reads an archive's manifest and returns a reader positioned after
// it. It refuses a file that is not a Tether backup, a format or schema
// newer than this build's, and an encrypted one it cannot open.
func Open(r io.Reader, dec Decryption, opts RestoreOptions) (Manifest, *tar.Reader, error) {
	br := bufio.NewReaderSize(r, 1<<20)
	head, _ := br.Peek(len(ageMagic))
	var in io.Reader = br
	if string(head) == ageMagic {
		ids, err := dec.identities()
		if err != nil {
			return Manifest{}, nil, err
		}
		if len(ids) == 0 {
			return Manifest{}, nil, errors.New("restore: the backup is encrypted: give its passphrase (--passphrase-file) or an identity (--identity)")
		}
		if in, err = age.Decrypt(br, ids...); err != nil {
			return Manifest{}, nil, fmt.Errorf("restore: cannot decrypt the backup (wrong passphrase or identity?): %w", err)
		}
	}
	tr := tar.NewReader(in)
	h, err := tr.Next()
	if err != nil {
		return Manifest{}, nil, fmt.Errorf("restore: not a Tether backup (no archive header: %v)", err)
	}
	if h.Name != ManifestName || h.Size > maxManifest {
		return Manifest{}, nil, fmt.Errorf("restore: not a Tether backup (its first entry is %q, not %s)", h.Name, ManifestName)
	}
	raw, err := io.ReadAll(tr)
	if err != nil {
		return Manifest{}, nil, fmt.Errorf("restore: truncated backup (the manifest ends early: %v)", err)
	}
	var m Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return Manifest{}, nil, fmt.Errorf("restore: not a Tether backup (its manifest does not parse: %v)", err)
	}
	switch {
	case m.Format != Format:
		return Manifest{}, nil, fmt.Errorf("restore: not a Tether backup (format %q)", m.Format)
	case m.Version > Version:
		return Manifest{}, nil, fmt.Errorf("restore: the backup's format is version %d and this build reads up to %d: restore with the build that made it, or a newer one", m.Version, Version)
	case !m.KeysOnly && m.SchemaVersion > opts.MaxSchema:
		return Manifest{}, nil, fmt.Errorf("restore: the backup's database has schema %d and this build knows up to %d: restore with the build that made it, or a newer one", m.SchemaVersion, opts.MaxSchema)
	}
	seen := map[string]bool{}
	for _, f := range m.Files {
		if !validPath(f.Path) || f.Path == ManifestName || f.Path == RestoredMarker || seen[f.Path] || f.Size < 0 {
			return Manifest{}, nil, fmt.Errorf("restore: the manifest names a file it may not: %q", f.Path)
		}
		seen[f.Path] = true
	}
	return m, tr, nil
}

// Restore rebuilds dataDir from the archive at in. dataDir must not exist
// or be empty: nothing already there is overwritten. Everything is
// written and verified in a folder beside it first, which is renamed into
// place only when every file checked out.
func Restore(ctx context.Context, in string, dec Decryption, dataDir string, opts RestoreOptions) (_ Manifest, err error) {
	if err := checkTarget(dataDir); err != nil {
		return Manifest{}, err
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	f, err := os.Open(in)
	if err != nil {
		return Manifest{}, fmt.Errorf("restore: %w", err)
	}
	defer f.Close()
	m, tr, err := Open(f, dec, opts)
	if err != nil {
		return Manifest{}, err
	}
	parent := filepath.Dir(filepath.Clean(dataDir))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return Manifest{}, fmt.Errorf("restore: %w", err)
	}
	stage, err := os.MkdirTemp(parent, ".tether-restore-")
	if err != nil {
		return Manifest{}, fmt.Errorf("restore: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(stage)
		}
	}()
	want := map[string]File{}
	for _, fm := range m.Files {
		want[fm.Path] = fm
	}
	var done int64
	total := m.Bytes()
	for {
		if err := ctx.Err(); err != nil {
			return Manifest{}, err
		}
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return Manifest{}, fmt.Errorf("restore: truncated or corrupt backup (after %d of %d bytes: %v)", done, total, err)
		}
		fm, ok := want[h.Name]
		if !ok {
			return Manifest{}, fmt.Errorf("restore: corrupt backup: %q is not in its manifest, or appears twice", h.Name)
		}
		delete(want, h.Name)
		if h.Typeflag != tar.TypeReg || h.Size != fm.Size {
			return Manifest{}, fmt.Errorf("restore: corrupt backup: %s is %d bytes, its manifest says %d", h.Name, h.Size, fm.Size)
		}
		if err := extract(tr, stage, fm); err != nil {
			return Manifest{}, err
		}
		done += fm.Size
		if opts.Progress != nil {
			opts.Progress(done, total, fm.Path)
		}
	}
	if len(want) > 0 {
		var first string
		for p := range want {
			if first == "" || p < first {
				first = p
			}
		}
		return Manifest{}, fmt.Errorf("restore: truncated backup: %d of its %d files are missing (%s among them)", len(want), len(m.Files), first)
	}
	mk, err := json.MarshalIndent(Marker{BackupCreated: m.Created, Restored: opts.Now().UTC(), CAFingerprint: m.CAFingerprint,
		KeysOnly: m.KeysOnly, MissingBlobs: m.MissingBlobs}, "", "  ")
	if err != nil {
		return Manifest{}, fmt.Errorf("restore: %w", err)
	}
	if err := os.WriteFile(filepath.Join(stage, RestoredMarker), mk, 0o600); err != nil {
		return Manifest{}, fmt.Errorf("restore: %w", err)
	}
	// The target was checked empty above; an empty folder gives way to
	// the staged one, and a folder that filled since then makes Rename
	// fail rather than be merged into.
	if err := os.Remove(dataDir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return Manifest{}, fmt.Errorf("restore: %s: %w", dataDir, err)
	}
	if err := os.Rename(stage, dataDir); err != nil {
		return Manifest{}, fmt.Errorf("restore: %w", err)
	}
	return m, nil
}

// checkTarget refuses a data dir that holds anything.
func checkTarget(dataDir string) error {
	if dataDir == "" {
		return errors.New("restore: --data-dir is required")
	}
	entries, err := os.ReadDir(dataDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	if len(entries) == 0 {
		return nil
	}
	names := make([]string, 0, 3)
	live := false
	for _, e := range entries {
		if len(names) < 3 {
			names = append(names, e.Name())
		}
		live = live || e.Name() == DatabaseName+"-wal" || e.Name() == DatabaseName+"-shm"
	}
	why := ""
	if live {
		why = "; its database is open or was not closed cleanly, so a tetherd may be serving it"
	}
	return fmt.Errorf("restore: %s is not empty (%s%s)%s: restore into a new folder; nothing was changed",
		dataDir, strings.Join(names, ", "), map[bool]string{true: ", ...", false: ""}[len(entries) > 3], why)
}

// extract writes one file of the archive under stage and checks its hash.
func extract(r io.Reader, stage string, fm File) error {
	dst := filepath.Join(stage, filepath.FromSlash(fm.Path))
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, os.FileMode(fm.Mode&0o777)|0o600)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(out, h), r)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("restore: truncated or corrupt backup at %s: %w", fm.Path, err)
	}
	if n != fm.Size {
		return fmt.Errorf("restore: truncated backup: %s has %d of its %d bytes", fm.Path, n, fm.Size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != fm.SHA256 {
		return fmt.Errorf("restore: corrupt backup: %s does not match its checksum (sha256 %s, manifest %s)", fm.Path, got[:12], fm.SHA256[:min(12, len(fm.SHA256))])
	}
	return nil
}

// ReadMarker returns the restore marker of dataDir, or ok false when
// there is none; ClearMarker removes it.
func ReadMarker(dataDir string) (Marker, bool, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, RestoredMarker))
	if errors.Is(err, os.ErrNotExist) {
		return Marker{}, false, nil
	}
	if err != nil {
		return Marker{}, false, fmt.Errorf("restore marker: %w", err)
	}
	var mk Marker
	if err := json.Unmarshal(b, &mk); err != nil {
		return Marker{}, false, fmt.Errorf("restore marker %s: %w", filepath.Join(dataDir, RestoredMarker), err)
	}
	return mk, true, nil
}

// ClearMarker removes the marker once its event is recorded.
func ClearMarker(dataDir string) error {
	if err := os.Remove(filepath.Join(dataDir, RestoredMarker)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("restore marker: %w", err)
	}
	return nil
}
