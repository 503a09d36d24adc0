package modulebuild

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// fileCap is a valid v2 security.capability value granting cap_net_raw
// (bit 13) permitted and effective, as setcap cap_net_raw+ep writes it.
func fileCap() string {
	var b [20]byte
	binary.LittleEndian.PutUint32(b[0:], 0x02000000|0x1) // VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE
	binary.LittleEndian.PutUint32(b[4:], 1<<13)
	return string(b[:])
}

// sourceTree writes a root holding every kind of thing a real root has:
// links to files, to folders and out of the tree, hard links, devices, a
// FIFO, other owners, setuid and setgid bits, and xattrs.
func sourceTree(t *testing.T) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "tree")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "usr/bin"), 0o755))
	must(os.MkdirAll(filepath.Join(root, "usr/lib/x"), 0o755))
	must(os.MkdirAll(filepath.Join(root, "etc"), 0o755))
	must(os.MkdirAll(filepath.Join(root, "dev"), 0o755))
	must(os.MkdirAll(filepath.Join(root, "home/user"), 0o750))
	must(os.Chown(filepath.Join(root, "home/user"), 1000, 1000))
	write := func(p, body string, mode uint32, uid, gid int) {
		t.Helper()
		full := filepath.Join(root, p)
		must(os.WriteFile(full, []byte(body), 0o600))
		must(os.Chown(full, uid, gid))
		must(unix.Chmod(full, mode))
	}
	write("etc/os-release", "ID=test\n", 0o644, 0, 0)
	write("usr/bin/su", "setuid program", 0o4755, 0, 0)
	write("usr/bin/wall", "setgid program", 0o2755, 0, 5)
	write("usr/bin/ping", "capable program", 0o755, 0, 0)
	write("home/user/notes", "mine", 0o600, 1000, 1000)
	write("usr/lib/x/libx.so.1", strings.Repeat("library bytes ", 5000), 0o644, 0, 0)
	must(unix.Lsetxattr(filepath.Join(root, "usr/bin/ping"), "security.capability", []byte(fileCap()), 0))
	// Several on one file: their order must not depend on the run.
	for _, k := range []string{"user.tether.d", "user.tether.note", "user.tether.b", "user.tether.a", "user.tether.c"} {
		must(unix.Lsetxattr(filepath.Join(root, "etc/os-release"), k, []byte("kept "+k), 0))
	}
	must(os.Link(filepath.Join(root, "usr/bin/su"), filepath.Join(root, "usr/bin/su-again")))
	must(os.Symlink("usr/lib", filepath.Join(root, "lib")))                 // to a folder
	must(os.Symlink("libx.so.1", filepath.Join(root, "usr/lib/x/libx.so"))) // to a file
	must(os.Symlink("/etc/os-release", filepath.Join(root, "etc/abs")))     // absolute
	must(os.Symlink("../../../../outside", filepath.Join(root, "etc/out"))) // out of the tree
	must(os.Symlink("missing", filepath.Join(root, "etc/dangling")))
	must(unix.Mknod(filepath.Join(root, "dev/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	must(unix.Mknod(filepath.Join(root, "dev/loop0"), unix.S_IFBLK|0o660, int(unix.Mkdev(7, 0))))
	must(os.Chown(filepath.Join(root, "dev/loop0"), 0, 6))
	must(unix.Mkfifo(filepath.Join(root, "dev/initctl"), 0o600))
	return root
}

// tarTree writes dir as a tar stream the way tar -c --xattrs would, with
// hard links as links.
func tarTree(t *testing.T, dir string) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	seen := map[uint64]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name = rel
		if d.IsDir() {
			h.Name += "/"
		}
		st := fi.Sys().(*syscall.Stat_t)
		h.Uid, h.Gid, h.Uname, h.Gname = int(st.Uid), int(st.Gid), "", ""
		h.Mode = int64(st.Mode & 0o7777)
		h.Format = tar.FormatPAX
		if fi.Mode().IsRegular() && st.Nlink > 1 {
			if first, ok := seen[st.Ino]; ok {
				h.Typeflag, h.Linkname, h.Size = tar.TypeLink, first, 0
			} else {
				seen[st.Ino] = rel
			}
		}
		for k, v := range xattrs(t, p) {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords["SCHILY.xattr."+k] = v
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func xattrs(t *testing.T, p string) map[string]string {
	t.Helper()
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(p, buf)
	if err != nil {
		t.Fatalf("listxattr %s: %v", p, err)
	}
	out := map[string]string{}
	for _, k := range strings.Split(string(buf[:n]), "\x00") {
		if k == "" || k == "security.selinux" {
			continue
		}
		v := make([]byte, 4096)
		m, err := unix.Lgetxattr(p, k, v)
		if err != nil {
			t.Fatalf("getxattr %s %s: %v", p, k, err)
		}
		out[k] = string(v[:m])
	}
	return out
}

// describe is one line per entry of a tree: type, mode bits (setuid
// included), owner, device numbers, content hash, link target, xattrs,
// and which entries share an inode. Two trees are the same root when their
// descriptions are equal.
func describe(t *testing.T, root string) string {
	t.Helper()
	var lines []string
	inodes := map[uint64][]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		line := fmt.Sprintf("%s type=%o mode=%04o owner=%d:%d", rel, st.Mode&unix.S_IFMT, st.Mode&0o7777, st.Uid, st.Gid)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			line += " sha256=" + hex.EncodeToString(sum[:8])
			if st.Nlink > 1 {
				inodes[st.Ino] = append(inodes[st.Ino], rel)
			}
		case unix.S_IFLNK:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			line += " -> " + l
		case unix.S_IFCHR, unix.S_IFBLK:
			line += fmt.Sprintf(" dev=%d,%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			x := xattrs(t, p)
			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				line += fmt.Sprintf(" xattr:%s=%x", k, x[k])
			}
		}
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, names := range inodes {
		sort.Strings(names)
		lines = append(lines, "hardlinked "+strings.Join(names, " "))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// mountErofs mounts img read-only with the kernel and unmounts it at the
// end of the test.
func mountErofs(t *testing.T, img string) string {
	t.Helper()
	fss, _ := os.ReadFile("/proc/filesystems")
	if !strings.Contains(string(fss), "erofs") {
		_ = exec.Command("modprobe", "erofs").Run()
		if fss, _ = os.ReadFile("/proc/filesystems"); !strings.Contains(string(fss), "erofs") {
			t.Skip("SKIP: the kernel has no erofs (not in /proc/filesystems, modprobe erofs failed)")
		}
	}
	if _, err := exec.LookPath("mount"); err != nil {
		t.Skip("SKIP: mount(8) not on PATH")
	}
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "erofs", "-o", "loop,ro", img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount %s: %v: %s", img, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
	})
	return mnt
}

// TestMountedImageMatchesSource builds the same root from a folder, a tar
// stream, a gzip'd tar file and an OCI layout, mounts each image with the
// kernel and compares it entry by entry with the source tree.
func TestMountedImageMatchesSource(t *testing.T) {
	needMkfs(t)
	needRoot(t)
	src := sourceTree(t)
	want := describe(t, src)
	for _, must := range []string{"usr/bin/su type=100000 mode=4755", "xattr:security.capability=", "dev/null type=20000", "dev/initctl type=10000", "hardlinked usr/bin/su usr/bin/su-again", "-> ../../../../outside", "-> usr/lib"} {
		if !strings.Contains(want, must) {
			t.Fatalf("the source tree lacks %q; the test would prove nothing:\n%s", must, want)
		}
	}
	tarBytes := tarTree(t, src)
	tarFile := filepath.Join(t.TempDir(), "root.tar.gz")
	if err := os.WriteFile(tarFile, gzipped(t, tarBytes), 0o644); err != nil {
		t.Fatal(err)
	}
	oci := writeLayout(t, imageOf(t, "amd64", tarBytes))
	cases := []struct {
		name string
		opts Options
		kind Kind
	}{
		{"folder", Options{Source: src}, KindDir},
		{"tar on stdin", Options{Source: "-", Stdin: bytes.NewReader(tarBytes)}, KindTar},
		{"gzip tar file", Options{Source: tarFile}, KindTar},
		{"oci layout", Options{Source: oci}, KindOCILayout},
		{"folder uncompressed", Options{Source: src, Compress: "none"}, KindDir},
		{"folder lz4", Options{Source: src, Compress: "lz4"}, KindDir},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.opts.Out = filepath.Join(t.TempDir(), "m.erofs")
			res, err := Build(t.Context(), c.opts)
			if err != nil {
				t.Fatal(err)
			}
			if res.Kind != c.kind {
				t.Errorf("detected %s, want %s", res.Kind, c.kind)
			}
			got := describe(t, mountErofs(t, c.opts.Out))
			if got != want {
				t.Errorf("mounted image differs from the source\n--- source\n%s\n--- image\n%s", want, got)
			}
		})
	}
}

// TestRealTreeRoundTrip does for a real root (TETHER_BENCH_TREE, e.g. a
// Debian tree from mmdebstrap) what TestMountedImageMatchesSource does for
// the small one: built from its folder and from `tar --xattrs -c` of it,
// each mounted image must describe the same as the folder, and both give
// one digest.
func TestRealTreeRoundTrip(t *testing.T) {
	tree := os.Getenv("TETHER_BENCH_TREE")
	if tree == "" {
		t.Skip("SKIP: set TETHER_BENCH_TREE to a root folder to check a real tree")
	}
	needMkfs(t)
	needRoot(t)
	want := describe(t, tree)
	tarFile := filepath.Join(t.TempDir(), "root.tar")
	if out, err := exec.Command("tar", "--xattrs", "--xattrs-include=*", "--numeric-owner", "-C", tree, "-cf", tarFile, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v %s", err, out)
	}
	var digests []string
	for _, src := range []string{tree, tarFile} {
		out := filepath.Join(t.TempDir(), "m.erofs")
		res, err := Build(t.Context(), Options{Source: src, Out: out})
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, res.Digest)
		if got := describe(t, mountErofs(t, out)); got != want {
			t.Errorf("%s: the mounted image differs from the tree:\n%s", src, firstDiff(want, got))
		}
	}
	if digests[0] != digests[1] {
		t.Errorf("folder and tarball of one tree: %s and %s", digests[0], digests[1])
	}
	t.Logf("%d entries match; digest %s", strings.Count(want, "\n")+1, digests[0])
}

func firstDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := 0; i < len(al) && i < len(bl); i++ {
		if al[i] != bl[i] {
			return fmt.Sprintf("line %d:\n  tree:  %s\n  image: %s", i, al[i], bl[i])
		}
	}
	return fmt.Sprintf("%d lines against %d", len(al), len(bl))
}
