// Package seediso reads and writes the seed ISO: a small ISO 9660 image
// labelled TETHERSEED that carries a node's enrollment material in a tether/
// directory (url, token, ca). It is the transport for providers that can
// neither set the kernel command line nor pass QEMU fw_cfg entries.
//
// The agent reads it (agent/identity); the control plane writes it
// (`tetherctl instance seed-iso`). Both sides share this package so the
// layout cannot drift. It depends only on go-diskfs's iso9660 package, not on
// the whole of go-diskfs, to keep the agent binary small.
package seediso

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"
)

// Label is the volume identifier of a seed ISO.
const Label = "TETHERSEED"

// Dir is the directory inside the image that holds the material.
const Dir = "tether"

// File names inside Dir.
const (
	FileURL   = "url"
	FileToken = "token"
	FileCA    = "ca"
)

// MaxFieldBytes bounds what the reader takes from one file: the material is
// a URL, a token and a fingerprint, never more than a few hundred bytes, and
// an image from an untrusted disk must not make PID 1 allocate at will.
const MaxFieldBytes = 4096

// blockSize is the only logical block size every ISO 9660 reader accepts.
const blockSize = 2048

// ErrNotSeed means the image is readable but is not a seed ISO (another
// label, or not ISO 9660 at all). Callers scanning block devices skip it.
var ErrNotSeed = errors.New("not a tether seed ISO")

// Material is the enrollment material a seed ISO carries. CA is the CA
// certificate's fingerprint, "sha256:<hex>".
type Material struct {
	URL   string
	Token string
	CA    string
}

// Write creates (or replaces) a seed ISO at path holding m. The image is
// written beside path and renamed into place, so a reader never sees half an
// image. It is created 0600 because it holds a bootstrap token; loosen it
// if the hypervisor runs as another user.
func Write(path string, m Material) (err error) {
	if err := m.validate(); err != nil {
		return fmt.Errorf("seed iso: %w", err)
	}
	dir := filepath.Dir(path)
	workspace, err := os.MkdirTemp(dir, ".seediso-ws-")
	if err != nil {
		return fmt.Errorf("seed iso: workspace: %w", err)
	}
	defer os.RemoveAll(workspace)
	tmp := filepath.Join(dir, "."+filepath.Base(path)+".partial")
	_ = os.Remove(tmp)
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()

	if err := os.Mkdir(filepath.Join(workspace, Dir), 0o755); err != nil {
		return fmt.Errorf("seed iso: %w", err)
	}
	for _, f := range []struct{ name, value string }{
		{FileURL, m.URL}, {FileToken, m.Token}, {FileCA, m.CA},
	} {
		// No trailing newline: the same bytes fw_cfg carries.
		if err := os.WriteFile(filepath.Join(workspace, Dir, f.name), []byte(f.value), 0o644); err != nil {
			return fmt.Errorf("seed iso: write %s/%s: %w", Dir, f.name, err)
		}
	}

	b, err := file.CreateFromPath(tmp, 1<<20)
	if err != nil {
		return fmt.Errorf("seed iso: create %s: %w", tmp, err)
	}
	defer b.Close()
	// The image carries a bootstrap token: readable by its owner only.
	if err := os.Chmod(tmp, 0o600); err != nil {
		return fmt.Errorf("seed iso: %w", err)
	}
	fsys, err := iso9660.Create(b, 0, 0, blockSize, workspace)
	if err != nil {
		return fmt.Errorf("seed iso: create filesystem: %w", err)
	}
	err = fsys.Finalize(iso9660.FinalizeOptions{RockRidge: true, Joliet: true, VolumeIdentifier: Label})
	if err != nil {
		return fmt.Errorf("seed iso: finalize: %w", err)
	}
	// The backing file was made large enough for any seed; cut it to the
	// volume go-diskfs actually wrote.
	f, err := b.Sys()
	if err == nil {
		err = truncateToVolume(f)
	}
	if err == nil {
		err = f.Sync()
	}
	if err != nil {
		return fmt.Errorf("seed iso: sync %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("seed iso: %w", err)
	}
	return nil
}

func truncateToVolume(f *os.File) error {
	pvd := make([]byte, sectorSize)
	if _, err := f.ReadAt(pvd, firstVDSector*sectorSize); err != nil {
		return err
	}
	blocks := int64(binary.LittleEndian.Uint32(pvd[80:84]))
	if blocks <= firstVDSector {
		return fmt.Errorf("volume of %d blocks is too small", blocks)
	}
	return f.Truncate(blocks * sectorSize)
}

// Read opens the image or block device at path and returns the material in
// it. It returns an error wrapping ErrNotSeed when path holds no seed ISO.
func Read(path string) (Material, error) {
	f, err := os.Open(path)
	if err != nil {
		return Material{}, fmt.Errorf("seed iso %s: %w", path, err)
	}
	defer f.Close()
	m, err := ReadFrom(f)
	if err != nil {
		return Material{}, fmt.Errorf("seed iso %s: %w", path, err)
	}
	return m, nil
}

// ReadFrom reads a seed ISO from an open image or device. A malformed image
// gives an error, never a panic or a runaway allocation: the agent runs as
// PID 1, and its death takes the kernel down with it.
func ReadFrom(r io.ReaderAt) (m Material, err error) {
	img, err := loadImage(r)
	if err != nil {
		return Material{}, err
	}
	if err := checkImage(img); err != nil {
		return Material{}, fmt.Errorf("malformed seed ISO: %w", err)
	}
	defer func() {
		if r := recover(); r != nil {
			m, err = Material{}, fmt.Errorf("malformed seed ISO: %v", r)
		}
	}()
	fsys, err := iso9660.Read(file.New(memImage{bytes.NewReader(img)}, true), int64(len(img)), 0, blockSize)
	if err != nil {
		return Material{}, fmt.Errorf("malformed seed ISO: %w", err)
	}
	// loadImage checked the label already; this is go-diskfs's view of it.
	if label := TrimLabel(fsys.Label()); label != Label {
		return Material{}, fmt.Errorf("%w: volume label is %q, want %q", ErrNotSeed, label, Label)
	}
	files, err := readDir(fsys)
	if err != nil {
		return Material{}, err
	}
	return Parse(files)
}

// TrimLabel removes the padding ISO 9660 puts after a volume identifier:
// go-diskfs hands it back NUL-padded, other tools pad with spaces.
func TrimLabel(s string) string {
	return strings.TrimRight(s, "\x00 ")
}

// readDir loads every regular file in the tether/ directory, keyed by its
// normalised name, so images made by other tools (plain ISO 9660 names such
// as "URL.;1") read the same as ours.
func readDir(fsys *iso9660.FileSystem) (map[string][]byte, error) {
	dir := Dir
	entries, err := fsys.ReadDir(dir)
	if err != nil {
		// Try the upper-case name a tool without Rock Ridge writes.
		dir = strings.ToUpper(Dir)
		var err2 error
		if entries, err2 = fsys.ReadDir(dir); err2 != nil {
			return nil, fmt.Errorf("seed ISO has no %s/ directory: %w", Dir, err)
		}
	}
	files := make(map[string][]byte)
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		name := NormaliseName(e.Name())
		if name != FileURL && name != FileToken && name != FileCA {
			continue
		}
		data, err := readLimited(fsys, dir+"/"+e.Name())
		if err != nil {
			return nil, fmt.Errorf("read %s/%s: %w", Dir, name, err)
		}
		files[name] = data
	}
	return files, nil
}

func readLimited(fsys *iso9660.FileSystem, p string) ([]byte, error) {
	f, err := fsys.OpenFile(p, os.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFieldBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFieldBytes {
		return nil, fmt.Errorf("larger than %d bytes", MaxFieldBytes)
	}
	return data, nil
}

// NormaliseName maps an ISO 9660 file name to the name it was written as:
// lower case, without the ";1" version suffix or the trailing dot that
// plain ISO 9660 adds to a name with no extension.
func NormaliseName(name string) string {
	name = strings.ToLower(name)
	if i := strings.IndexByte(name, ';'); i >= 0 {
		name = name[:i]
	}
	return strings.TrimSuffix(name, ".")
}

// Parse turns the raw contents of the tether/ files into Material. Each
// value may end in whitespace (a file written with echo); anything else
// unusual is refused with the file's name, since the values end up in a URL
// and a TLS pin.
func Parse(files map[string][]byte) (Material, error) {
	var m Material
	for _, f := range []struct {
		name string
		dst  *string
	}{{FileURL, &m.URL}, {FileToken, &m.Token}, {FileCA, &m.CA}} {
		raw, ok := files[f.name]
		if !ok {
			return Material{}, fmt.Errorf("seed ISO is missing %s/%s", Dir, f.name)
		}
		v, err := ParseField(f.name, raw)
		if err != nil {
			return Material{}, err
		}
		*f.dst = v
	}
	return m, nil
}

// ParseField validates one value: at most MaxFieldBytes, printable ASCII
// with no inner whitespace once the trailing whitespace is trimmed.
func ParseField(name string, raw []byte) (string, error) {
	if len(raw) > MaxFieldBytes {
		return "", fmt.Errorf("seed ISO file %s/%s: larger than %d bytes", Dir, name, MaxFieldBytes)
	}
	v := strings.TrimRight(string(raw), " \t\r\n")
	if v == "" {
		return "", fmt.Errorf("seed ISO file %s/%s is empty", Dir, name)
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c <= ' ' || c >= 0x7f {
			return "", fmt.Errorf("seed ISO file %s/%s: byte %d is %q, want printable ASCII without spaces", Dir, name, i, c)
		}
	}
	return v, nil
}

func (m Material) validate() error {
	for _, f := range []struct{ name, v string }{{FileURL, m.URL}, {FileToken, m.Token}, {FileCA, m.CA}} {
		if _, err := ParseField(f.name, []byte(f.v)); err != nil {
			return err
		}
		if f.v != strings.TrimSpace(f.v) {
			return fmt.Errorf("%s: surrounding whitespace", f.name)
		}
	}
	return nil
}
