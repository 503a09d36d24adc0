// Package backup writes and reads a Tether backup: one archive that holds
// what a data dir cannot be rebuilt without (the CA key, the server
// certificate, the admin identity, the key that seals BMC credentials), a
// consistent snapshot of the SQLite database, and the module blobs.
//
// The archive is a tar stream whose first entry is a manifest naming every
// file with its size and SHA-256, so that a corrupt, truncated or foreign
// file is refused before anything is written where a data dir would be.
// It may be encrypted with age to a passphrase or to recipients.
package backup

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"filippo.io/age"
)

// Format and Version name the archive layout; a reader refuses others.
const (
	Format  = "tether-backup"
	Version = 1
	// ManifestName is the archive's first entry.
	ManifestName = "manifest.json"
	// DatabaseName is the snapshot's path in the archive and in a data dir.
	DatabaseName = "tether.db"
	// RestoredMarker is left in a restored data dir; tetherd's first start
	// on it records what the restore lost in an event, then removes it.
	RestoredMarker = "restored.json"
)

// maxManifest bounds the manifest a reader will parse (a data dir with a
// hundred thousand blobs needs about 15 MB).
const maxManifest = 64 << 20

// File is one file of the archive.
type File struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	Mode   uint32 `json:"mode"`
}

// Manifest describes an archive.
type Manifest struct {
	Format  string    `json:"format"`
	Version int       `json:"version"`
	Created time.Time `json:"created_at"`
	// Store is "sqlite" when the archive holds the database, or the kind
	// of store whose database is backed up by other means ("postgres",
	// KeysOnly).
	Store    string `json:"store"`
	KeysOnly bool   `json:"keys_only"`
	// SchemaVersion is the database's newest migration (0 when KeysOnly).
	SchemaVersion int    `json:"schema_version"`
	CAFingerprint string `json:"ca_fingerprint,omitempty"`
	Files         []File `json:"files"`
	// MissingBlobs were named by the data dir when the backup started but
	// gone (deleted) when it reached them.
	MissingBlobs []string `json:"missing_blobs,omitempty"`
}

// Bytes is the sum of the files' sizes.
func (m Manifest) Bytes() int64 {
	var n int64
	for _, f := range m.Files {
		n += f.Size
	}
	return n
}

// Source is what a backup reads.
type Source struct {
	// DataDir is the live data dir.
	DataDir string
	// Snapshot writes a consistent copy of the database to dst, which does
	// not exist yet (SQLite's VACUUM INTO). Nil with KeysOnly.
	Snapshot func(ctx context.Context, dst string) error
	// SchemaVersion reads the snapshot's newest migration.
	SchemaVersion func(ctx context.Context, db string) (int, error)
	// Store names the store for the manifest.
	Store         string
	KeysOnly      bool
	CAFingerprint string
	// Skip reports data-dir paths (slash-separated, relative) that are not
	// part of a backup: VM state, sockets, uploads in flight.
	Skip func(rel string, d fs.DirEntry) bool
	Now  func() time.Time
	// Progress, when set, is told of each file as it is written.
	Progress func(done, total int64, name string)
}

// Encryption seals an archive. The zero value writes it in the clear.
type Encryption struct {
	Passphrase string
	Recipients []string // age recipients (age1...)
	// workFactor, when set, is scrypt's log2 cost in place of age's
	// default (18, about a second): tests use a cheap one.
	workFactor int
}

func (e Encryption) recipients() ([]age.Recipient, error) {
	var out []age.Recipient
	if e.Passphrase != "" {
		r, err := age.NewScryptRecipient(e.Passphrase)
		if err != nil {
			return nil, fmt.Errorf("backup: passphrase: %w", err)
		}
		if e.workFactor > 0 {
			r.SetWorkFactor(e.workFactor)
		}
		out = append(out, r)
	}
	for _, s := range e.Recipients {
		r, err := age.ParseX25519Recipient(s)
		if err != nil {
			return nil, fmt.Errorf("backup: recipient %q: %w", s, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// Create writes a backup of src to out, a path that must not exist: an
// older backup is never overwritten. The file is 0600 and is removed
// again if the backup fails.
func Create(ctx context.Context, src Source, enc Encryption, out string) (_ Manifest, err error) {
	recips, err := enc.recipients()
	if err != nil {
		return Manifest{}, err
	}
	if !src.KeysOnly && (src.Snapshot == nil || src.SchemaVersion == nil) {
		return Manifest{}, errors.New("backup: a full backup needs the database snapshot (or --keys-only)")
	}
	if src.Now == nil {
		src.Now = time.Now
	}
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return Manifest{}, fmt.Errorf("backup: %w (refusing to overwrite an existing file)", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(out)
		}
	}()
	stage, err := os.MkdirTemp(filepath.Dir(out), ".tether-backup-")
	if err != nil {
		return Manifest{}, fmt.Errorf("backup: %w", err)
	}
	defer os.RemoveAll(stage)

	m := Manifest{Format: Format, Version: Version, Created: src.Now().UTC(), Store: src.Store, KeysOnly: src.KeysOnly,
		CAFingerprint: src.CAFingerprint}
	// The database first: every blob its snapshot names was written before
	// the row that names it committed, so it is in the data dir when the
	// walk below reaches the blobs.
	var files []staged
	if !src.KeysOnly {
		db := filepath.Join(stage, DatabaseName)
		if err := src.Snapshot(ctx, db); err != nil {
			return Manifest{}, fmt.Errorf("backup: snapshot the database: %w", err)
		}
		if m.SchemaVersion, err = src.SchemaVersion(ctx, db); err != nil {
			return Manifest{}, fmt.Errorf("backup: read the snapshot's schema: %w", err)
		}
		files = append(files, staged{rel: DatabaseName, abs: db})
	}
	more, err := walk(src)
	if err != nil {
		return Manifest{}, err
	}
	files = append(files, more...)
	for _, s := range files {
		fm, err := describe(s)
		if errors.Is(err, fs.ErrNotExist) && strings.HasPrefix(s.rel, "blobs/") {
			m.MissingBlobs = append(m.MissingBlobs, s.rel)
			continue
		}
		if err != nil {
			return Manifest{}, err
		}
		m.Files = append(m.Files, fm)
	}

	var w io.Writer = f
	var sealed io.WriteCloser
	if len(recips) > 0 {
		if sealed, err = age.Encrypt(f, recips...); err != nil {
			return Manifest{}, fmt.Errorf("backup: encrypt: %w", err)
		}
		w = sealed
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	tw := tar.NewWriter(bw)
	mb, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return Manifest{}, fmt.Errorf("backup: manifest: %w", err)
	}
	if err := writeEntry(tw, ManifestName, 0o600, int64(len(mb)), bytes.NewReader(mb), m.Created); err != nil {
		return Manifest{}, err
	}
	byRel := map[string]string{}
	for _, s := range files {
		byRel[s.rel] = s.abs
	}
	var done int64
	total := m.Bytes()
	for _, fm := range m.Files {
		if err := ctx.Err(); err != nil {
			return Manifest{}, err
		}
		if err := copyFile(tw, fm, byRel[fm.Path], m.Created); err != nil {
			return Manifest{}, err
		}
		done += fm.Size
		if src.Progress != nil {
			src.Progress(done, total, fm.Path)
		}
	}
	if err := tw.Close(); err != nil {
		return Manifest{}, fmt.Errorf("backup: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return Manifest{}, fmt.Errorf("backup: %w", err)
	}
	if sealed != nil {
		if err := sealed.Close(); err != nil {
			return Manifest{}, fmt.Errorf("backup: encrypt: %w", err)
		}
	}
	if err := f.Sync(); err != nil {
		return Manifest{}, fmt.Errorf("backup: %w", err)
	}
	if err := f.Close(); err != nil {
		return Manifest{}, fmt.Errorf("backup: %w", err)
	}
	return m, nil
}

type staged struct{ rel, abs string }

// walk lists the data dir's regular files that belong in the backup.
func walk(src Source) ([]staged, error) {
	var out []staged
	err := filepath.WalkDir(src.DataDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src.DataDir, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		rel = filepath.ToSlash(rel)
		if skipAlways(rel) || (src.KeysOnly && rel == "blobs") || (src.Skip != nil && src.Skip(rel, d)) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Type().IsRegular() {
			out = append(out, staged{rel: rel, abs: p})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("backup: read %s: %w", src.DataDir, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].rel < out[j].rel })
	return out, nil
}

// skipAlways are the data dir's files that a backup never copies: the
// live database (its snapshot stands in for it) and the marker of an
// earlier restore.
func skipAlways(rel string) bool {
	switch rel {
	case DatabaseName, DatabaseName + "-wal", DatabaseName + "-shm", DatabaseName + "-journal", RestoredMarker:
		return true
	}
	return false
}

func describe(s staged) (File, error) {
	f, err := os.Open(s.abs)
	if err != nil {
		return File{}, fmt.Errorf("backup: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return File{}, fmt.Errorf("backup: %w", err)
	}
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return File{}, fmt.Errorf("backup: read %s: %w", s.rel, err)
	}
	return File{Path: s.rel, Size: n, SHA256: hex.EncodeToString(h.Sum(nil)), Mode: uint32(st.Mode().Perm())}, nil
}

// copyFile writes one file into the archive and checks that what it
// wrote is what the manifest says: a file that changed under the backup
// (a key rewritten) fails it rather than leaving a backup that restores
// to an error.
func copyFile(tw *tar.Writer, fm File, abs string, mtime time.Time) error {
	f, err := os.Open(abs)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if err := writeEntry(tw, fm.Path, fm.Mode, fm.Size, io.TeeReader(io.LimitReader(f, fm.Size), h), mtime); err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != fm.SHA256 {
		return fmt.Errorf("backup: %s changed while it was being backed up; run the backup again", fm.Path)
	}
	return nil
}

func writeEntry(tw *tar.Writer, name string, mode uint32, size int64, r io.Reader, mtime time.Time) error {
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: int64(mode), Size: size, ModTime: mtime, Typeflag: tar.TypeReg, Format: tar.FormatPAX}); err != nil {
		return fmt.Errorf("backup: %s: %w", name, err)
	}
	n, err := io.Copy(tw, r)
	if err != nil {
		return fmt.Errorf("backup: %s: %w", name, err)
	}
	if n != size {
		return fmt.Errorf("backup: %s changed while it was being backed up (%d bytes, then %d); run the backup again", name, size, n)
	}
	return nil
}

// validPath reports whether an archive path may be written under a data
// dir: relative, clean, and inside it.
func validPath(p string) bool {
	return p != "" && p != "." && !path.IsAbs(p) && path.Clean(p) == p && p != ".." && !strings.HasPrefix(p, "../") &&
		!strings.Contains(p, "\\")
}
