package modulebuild

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	securejoin "github.com/cyphar/filepath-securejoin"
	"golang.org/x/sys/unix"
)

// OCI whiteout markers (image-spec layer.md): ".wh.NAME" deletes NAME from
// the layers below, ".wh..wh..opq" hides everything below in its folder.
const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
)

// stager applies tar streams to a staging folder. It never writes outside
// root: entry names that climb out are refused, and parent folders are
// resolved with symlinks evaluated as if root were "/" (securejoin), so a
// link such as lib -> /usr/lib in one layer sends a later lib/x into
// root/usr/lib, never into the build host's /usr/lib. The final component
// is never followed: links are stored as links, whatever they point at.
type stager struct {
	ctx      context.Context // an interrupt stops the staging between entries
	root     string
	maxBytes int64 // regular-file bytes allowed in the whole tree
	bytes    int64
	entries  int
	progress func(stagedBytes int64)
}

// apply writes one tar stream into the tree. whiteouts is true for image
// layers; a plain tarball (docker export, tar -c) has none, so a file named
// .wh.x in it is just a file.
func (s *stager) apply(r io.Reader, whiteouts bool) error {
	tr := tar.NewReader(r)
	written := map[string]bool{} // names this layer wrote, which its own opaque marker must keep
	for {
		if err := s.ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read tar: %w", err)
		}
		name, err := entryName(hdr.Name)
		if err != nil {
			return err
		}
		base := path.Base(name)
		if whiteouts && strings.HasPrefix(base, whiteoutPrefix) {
			if err := s.whiteout(name, written); err != nil {
				return err
			}
			continue
		}
		if err := s.entry(tr, hdr, name); err != nil {
			return fmt.Errorf("tar entry %q: %w", hdr.Name, err)
		}
		written[name] = true
		s.entries++
	}
}

// entryName cleans a tar name to a path relative to the tree root, or
// refuses it. "./etc/x" and "etc/x" are the same entry; "/etc/x" and
// "a/../../x" are refused rather than guessed at.
func entryName(n string) (string, error) {
	if strings.HasPrefix(n, "/") {
		return "", fmt.Errorf("tar entry %q: absolute path (an image tree's names are relative to its root)", n)
	}
	c := path.Clean(n)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("tar entry %q: path climbs out of the tree with ../", n)
	}
	return c, nil
}

// resolve returns where name lives in the staging tree: its parent
// resolved inside root, its own last component not followed.
func (s *stager) resolve(name string) (string, error) {
	if name == "." {
		return s.root, nil
	}
	parent, err := securejoin.SecureJoin(s.root, path.Dir(name))
	if err != nil {
		return "", fmt.Errorf("resolve parent: %w", err)
	}
	return filepath.Join(parent, path.Base(name)), nil
}

func (s *stager) whiteout(name string, written map[string]bool) error {
	dir, base := path.Dir(name), path.Base(name)
	if base == opaqueMarker {
		p, err := s.resolve(dir)
		if err != nil {
			return fmt.Errorf("opaque whiteout %q: %w", name, err)
		}
		ents, err := os.ReadDir(p)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("opaque whiteout %q: %w", name, err)
		}
		for _, e := range ents {
			// Entries of this same layer stay: the marker hides only
			// what lies below.
			if written[path.Join(dir, e.Name())] {
				continue
			}
			if err := os.RemoveAll(filepath.Join(p, e.Name())); err != nil {
				return fmt.Errorf("opaque whiteout %q: %w", name, err)
			}
		}
		return nil
	}
	victim := strings.TrimPrefix(base, whiteoutPrefix)
	if victim == "" || victim == "." || victim == ".." {
		// ".wh.." would delete the folder it sits in, or its parent.
		return fmt.Errorf("whiteout %q: names no entry of its folder", name)
	}
	target := path.Join(dir, victim)
	p, err := s.resolve(target)
	if err != nil {
		return fmt.Errorf("whiteout %q: %w", name, err)
	}
	if err := os.RemoveAll(p); err != nil {
		return fmt.Errorf("whiteout %q: %w", name, err)
	}
	return nil
}

func (s *stager) entry(tr io.Reader, hdr *tar.Header, name string) error {
	p, err := s.resolve(name)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("make parent: %w", err)
	}
	// Whatever the lower layer had at this name is replaced, except that a
	// folder over a folder merges (the upper one sets the metadata).
	if fi, err := os.Lstat(p); err == nil {
		if !(hdr.Typeflag == tar.TypeDir && fi.IsDir()) {
			if err := os.RemoveAll(p); err != nil {
				return fmt.Errorf("replace: %w", err)
			}
		}
	}
	mode := uint32(hdr.Mode) & 0o7777
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	case tar.TypeReg: // archive/tar reports the old TypeRegA as TypeReg
		if err := s.file(tr, p, hdr); err != nil {
			return err
		}
	case tar.TypeSymlink:
		// The target is kept verbatim, absolute or pointing outside:
		// the node resolves it inside its own root.
		if err := os.Symlink(hdr.Linkname, p); err != nil {
			return err
		}
	case tar.TypeLink:
		ln, err := entryName(hdr.Linkname)
		if err != nil {
			return fmt.Errorf("hard link target: %w", err)
		}
		src, err := s.resolve(ln)
		if err != nil {
			return fmt.Errorf("hard link target %q: %w", hdr.Linkname, err)
		}
		// link(2) does not follow a symlink at src, so a hard link to a
		// link stays one.
		if err := os.Link(src, p); err != nil {
			return fmt.Errorf("hard link to %q: %w", hdr.Linkname, err)
		}
		return nil // a hard link shares its target's owner, mode and xattrs
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		kind := map[byte]uint32{tar.TypeChar: unix.S_IFCHR, tar.TypeBlock: unix.S_IFBLK, tar.TypeFifo: unix.S_IFIFO}[hdr.Typeflag]
		dev := unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
		if err := unix.Mknod(p, kind|0o600, int(dev)); err != nil {
			return fmt.Errorf("mknod: %w%s", err, rootHint(err))
		}
	default:
		return fmt.Errorf("unsupported tar type %q", hdr.Typeflag)
	}
	return s.meta(p, hdr, mode)
}

func (s *stager) file(tr io.Reader, p string, hdr *tar.Header) error {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	left := s.maxBytes - s.bytes
	n, err := io.Copy(f, io.LimitReader(tr, left+1))
	s.bytes += n
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if n > left {
		return &TooLargeError{Limit: s.maxBytes, What: "the tree"}
	}
	if s.progress != nil {
		s.progress(s.bytes)
	}
	return nil
}

// meta sets owner, then mode (chown clears setuid bits), then xattrs (chown
// also drops security.capability).
func (s *stager) meta(p string, hdr *tar.Header, mode uint32) error {
	if err := unix.Lchown(p, hdr.Uid, hdr.Gid); err != nil {
		return fmt.Errorf("set owner %d:%d: %w%s", hdr.Uid, hdr.Gid, err, rootHint(err))
	}
	if hdr.Typeflag != tar.TypeSymlink {
		if err := unix.Fchmodat(unix.AT_FDCWD, p, mode, 0); err != nil {
			return fmt.Errorf("set mode %#o: %w", mode, err)
		}
	}
	// Set in sorted order: the staging filesystem lists xattrs in the
	// order they were set, mkfs.erofs stores them in the order listed, and
	// a map's order changes per run, which would change the digest.
	var attrs []string
	for k := range hdr.PAXRecords {
		if attr, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok {
			attrs = append(attrs, attr)
		}
	}
	sort.Strings(attrs)
	for _, attr := range attrs {
		v := hdr.PAXRecords["SCHILY.xattr."+attr]
		if err := unix.Lsetxattr(p, attr, []byte(v), 0); err != nil {
			return fmt.Errorf("set xattr %s: %w%s", attr, err, rootHint(err))
		}
	}
	return nil
}

func rootHint(err error) string {
	if errors.Is(err, unix.EPERM) {
		return " (staging a tarball or image with owners, devices or capabilities needs root; run as root, or build from a folder)"
	}
	return ""
}

// TooLargeError says the tree or image passed --max-size.
type TooLargeError struct {
	Limit int64
	What  string
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("%s is larger than the limit of %d bytes (--max-size)", e.What, e.Limit)
}
