// Package modules is the module registry: a content-addressed blob store in
// the data dir plus the (name, version) -> digest records in the store.
package modules

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ErofsMagic sits little-endian at byte offset 1024 of every erofs image.
const (
	ErofsMagic       = 0xE0F5E1E2
	ErofsMagicOffset = 1024
)

// Blobs stores immutable files by SHA-256 under dir/sha256/<hex>.
// Uploads are written to dir/tmp and renamed into place only once fully
// received and verified, so a partial upload is never visible.
type Blobs struct {
	dir string
}

// OpenBlobs creates the layout under dir.
func OpenBlobs(dir string) (*Blobs, error) {
	for _, d := range []string{filepath.Join(dir, "sha256"), filepath.Join(dir, "tmp")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("blob store: %w", err)
		}
	}
	return &Blobs{dir: dir}, nil
}

// ParseDigest validates "sha256:<64 lowercase hex>" and returns the hex.
func ParseDigest(d string) (string, error) {
	h, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(h) != 64 {
		return "", fmt.Errorf("digest %q: want sha256:<64 hex digits>", d)
	}
	if _, err := hex.DecodeString(h); err != nil || strings.ToLower(h) != h {
		return "", fmt.Errorf("digest %q: want lowercase hex", d)
	}
	return h, nil
}

// Path is where a blob lives.
func (b *Blobs) Path(digest string) (string, error) {
	h, err := ParseDigest(digest)
	if err != nil {
		return "", err
	}
	return filepath.Join(b.dir, "sha256", h), nil
}

// Open opens a stored blob.
func (b *Blobs) Open(digest string) (*os.File, error) {
	p, err := b.Path(digest)
	if err != nil {
		return nil, err
	}
	return os.Open(p)
}

// Has reports whether a blob is stored.
func (b *Blobs) Has(digest string) bool {
	p, err := b.Path(digest)
	if err != nil {
		return false
	}
	_, err = os.Stat(p)
	return err == nil
}

// Remove deletes a blob; a missing one is fine.
func (b *Blobs) Remove(digest string) error {
	p, err := b.Path(digest)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove blob %s: %w", digest, err)
	}
	return nil
}

// Upload receives one blob.
type Upload struct {
	b       *Blobs
	f       *os.File
	h       hash.Hash
	n       int64
	head    []byte // the first bytes, for the format check
	done    bool
	limit   int64
	checkFS bool
}

// ErrTooLarge is returned when an upload passes its declared size.
var ErrTooLarge = errors.New("upload is larger than declared")

// Create starts an upload of at most limit bytes. With erofs set, Commit
// checks the erofs superblock magic.
func (b *Blobs) Create(limit int64, erofs bool) (*Upload, error) {
	f, err := os.CreateTemp(filepath.Join(b.dir, "tmp"), "upload-*")
	if err != nil {
		return nil, fmt.Errorf("start upload: %w", err)
	}
	return &Upload{b: b, f: f, h: sha256.New(), limit: limit, checkFS: erofs}, nil
}

// Write implements io.Writer, hashing on the way.
func (u *Upload) Write(p []byte) (int, error) {
	if u.limit > 0 && u.n+int64(len(p)) > u.limit {
		return 0, fmt.Errorf("%w (%d bytes)", ErrTooLarge, u.limit)
	}
	if need := ErofsMagicOffset + 4 - len(u.head); need > 0 {
		if need > len(p) {
			need = len(p)
		}
		u.head = append(u.head, p[:need]...)
	}
	n, err := u.f.Write(p)
	u.h.Write(p[:n])
	u.n += int64(n)
	if err != nil {
		return n, fmt.Errorf("write upload: %w", err)
	}
	return n, nil
}

// Size is the number of bytes received.
func (u *Upload) Size() int64 { return u.n }

// Digest is the SHA-256 of what was received.
func (u *Upload) Digest() string { return "sha256:" + hex.EncodeToString(u.h.Sum(nil)) }

// ErrDigestMismatch means the data does not hash to the declared digest.
var ErrDigestMismatch = errors.New("digest mismatch")

// ErrNotErofs means the data lacks the erofs superblock magic.
var ErrNotErofs = errors.New("not an erofs image: no superblock magic 0xE0F5E1E2 at offset 1024")

// Commit verifies the upload (declared digest, format) and moves it into
// place. It returns the digest. On any error the upload is discarded.
func (u *Upload) Commit(declared string) (string, error) {
	defer u.Abort()
	digest := u.Digest()
	if u.checkFS {
		if len(u.head) < ErofsMagicOffset+4 || binary.LittleEndian.Uint32(u.head[ErofsMagicOffset:]) != ErofsMagic {
			return "", ErrNotErofs
		}
	}
	if declared != "" && declared != digest {
		return "", fmt.Errorf("%w: the client declared %s but the data hashes to %s", ErrDigestMismatch, declared, digest)
	}
	if err := u.f.Sync(); err != nil {
		return "", fmt.Errorf("sync upload: %w", err)
	}
	if err := u.f.Close(); err != nil {
		return "", fmt.Errorf("close upload: %w", err)
	}
	final, _ := u.b.Path(digest)
	if _, err := os.Stat(final); err == nil {
		return digest, nil // content already stored: same bytes, nothing to do
	}
	if err := os.Rename(u.f.Name(), final); err != nil {
		return "", fmt.Errorf("store blob: %w", err)
	}
	u.done = true
	if d, err := os.Open(filepath.Dir(final)); err == nil {
		_ = d.Sync() // make the rename durable
		d.Close()
	}
	return digest, nil
}

// Abort discards the upload (a no-op after a successful Commit).
func (u *Upload) Abort() {
	if u.done {
		return
	}
	u.done = true
	u.f.Close()
	os.Remove(u.f.Name())
}

// Ingest is Create + copy + Commit for a local file.
func (b *Blobs) Ingest(r io.Reader, erofs bool) (string, int64, error) {
	u, err := b.Create(0, erofs)
	if err != nil {
		return "", 0, err
	}
	if _, err := io.Copy(u, r); err != nil {
		u.Abort()
		return "", 0, err
	}
	d, err := u.Commit("")
	return d, u.Size(), err
}

// SweepTmp removes uploads older than age left by a crash mid-upload.
func (b *Blobs) SweepTmp(age time.Duration, now time.Time) (int, error) {
	entries, err := os.ReadDir(filepath.Join(b.dir, "tmp"))
	if err != nil {
		return 0, fmt.Errorf("sweep uploads: %w", err)
	}
	n := 0
	for _, e := range entries {
		info, err := e.Info()
		if err != nil || now.Sub(info.ModTime()) < age {
			continue
		}
		if os.Remove(filepath.Join(b.dir, "tmp", e.Name())) == nil {
			n++
		}
	}
	return n, nil
}
