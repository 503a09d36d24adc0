package rootfs

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"debug/elf"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	erofs "github.com/erofs/go-erofs"
	"golang.org/x/sys/unix"
)

// The privileged tests re-execute the test binary into a new mount
// namespace (SysProcAttr.Unshareflags = CLONE_NEWNS, which also makes every
// mount private before the child runs), so no mount can propagate to the
// host, and every mount dies with the child. The parent then checks that
// nothing leaked: no mount under the test's folders, no loop device still
// bound to the test's images.

const (
	childEnv = "TETHER_ROOTFS_TEST_CHILD"
	dirEnv   = "TETHER_ROOTFS_TEST_DIR"
)

func isChild(t *testing.T) bool { return os.Getenv(childEnv) == t.Name() }

func requirePrivileges(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipped: needs root for loop devices, mounts and a private mount namespace; CI runs it as root")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("skipped: no loop device support here (%v); as root, modprobe loop", err)
	}
	b, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		t.Fatal(err)
	}
	for _, fsType := range []string{"erofs", "overlay", "tmpfs"} {
		if !bytes.Contains(b, []byte("\t"+fsType+"\n")) {
			t.Skipf("skipped: the kernel has no %s filesystem; as root, modprobe %s", fsType, fsType)
		}
	}
}

// runChild runs the current test again in a new mount namespace with dir
// passed along, and returns its output.
func runChild(t *testing.T, dir string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+t.Name(), dirEnv+"="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child in a private mount namespace failed: %v\n%s", err, out)
	}
	t.Logf("child output:\n%s", out)
	return string(out)
}

// checkNoLeaks fails if a mount under dir is visible on the host, or a loop
// device is still bound to a file whose name contains tag.
func checkNoLeaks(t *testing.T, dir, tag string) {
	t.Helper()
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(mi, []byte(dir)) {
		t.Errorf("a mount under %s leaked into the host's namespace:\n%s", dir, mi)
	}
	// Autoclear runs when the namespace's mounts are released, which can
	// lag the child's exit a little.
	deadline := time.Now().Add(10 * time.Second)
	for {
		bound := boundLoops(tag)
		if len(bound) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("loop devices still bound to the test's images: %q", bound)
			return
		}
		time.Sleep(50 * time.Millisecond) // polls the kernel releasing loop devices
	}
}

func boundLoops(tag string) []string {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var bound []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil && bytes.Contains(b, []byte(tag)) {
			bound = append(bound, f+": "+strings.TrimSpace(string(b)))
		}
	}
	return bound
}

func uniqueTag(t *testing.T) string {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "tethertest" + hex.EncodeToString(b)
}

// entry is one file of a test image: content for a file, link for a symlink,
// neither for a directory.
type entry struct {
	name    string
	content string
	link    string
	dir     bool
	mode    fs.FileMode
}

// buildMkfsErofs builds a compressed image the way the examples are built.
func buildMkfsErofs(t *testing.T, out string, entries []entry) bool {
	t.Helper()
	if _, err := exec.LookPath("mkfs.erofs"); err != nil {
		return false
	}
	src := filepath.Join(t.TempDir(), "src")
	for _, e := range entries {
		p := filepath.Join(src, e.name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch {
		case e.dir:
			err = os.MkdirAll(p, 0o755)
		case e.link != "":
			err = os.Symlink(e.link, p)
		default:
			err = os.WriteFile(p, []byte(e.content), e.mode)
			if err == nil {
				err = os.Chmod(p, e.mode)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("mkfs.erofs", "-zlz4hc", "-T0", "-U", "00000000-0000-0000-0000-000000000001", "--all-root", "--quiet", out, src)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mkfs.erofs: %v\n%s", err, b)
	}
	return true
}

// buildGoErofs builds an uncompressed image with github.com/erofs/go-erofs.
func buildGoErofs(t *testing.T, out string, entries []entry) {
	t.Helper()
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := erofs.Create(f)
	made := map[string]bool{"/": true}
	var mkdirs func(string)
	mkdirs = func(d string) {
		if made[d] {
			return
		}
		mkdirs(filepath.Dir(d))
		if err := w.Mkdir(d, 0o755); err != nil {
			t.Fatalf("go-erofs mkdir %s: %v", d, err)
		}
		made[d] = true
	}
	for _, e := range entries {
		p := "/" + e.name
		mkdirs(filepath.Dir(p))
		switch {
		case e.dir:
			mkdirs(p)
		case e.link != "":
			if err := w.Symlink(e.link, p); err != nil {
				t.Fatalf("go-erofs symlink %s: %v", p, err)
			}
		default:
			fw, err := w.Create(p)
			if err != nil {
				t.Fatalf("go-erofs create %s: %v", p, err)
			}
			if _, err := fw.Write([]byte(e.content)); err != nil {
				t.Fatal(err)
			}
			if err := fw.Close(); err != nil {
				t.Fatal(err)
			}
			if err := w.Chmod(p, e.mode); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.Close(); err != nil {
		t.Fatalf("go-erofs close: %v", err)
	}
}

func mountinfoLines(t *testing.T, prefix string) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && under(fields[4], prefix) {
			lines = append(lines, sc.Text())
		}
	}
	return lines
}

// TestComposePrivileged composes a real root from two erofs images (one
// from mkfs.erofs with lz4hc, one from go-erofs) through real loop devices
// and an overlay, writes through it, tears it down, and checks a failure
// halfway leaves nothing behind.
func TestComposePrivileged(t *testing.T) {
	if isChild(t) {
		composeChild(t, os.Getenv(dirEnv))
		return
	}
	requirePrivileges(t)
	dir := t.TempDir()
	tag := uniqueTag(t)

	bottom := []entry{
		{name: "etc/os-release", content: "ID=bottom\n", mode: 0o644},
		{name: "etc/shared", content: "from bottom\n", mode: 0o644},
		{name: "bin/only-bottom", content: "#!/bin/sh\n", mode: 0o755},
		{name: "bin/link", link: "only-bottom"},
		{name: "var/deleteme", content: "x", mode: 0o644},
		{name: "var/empty", dir: true},
	}
	bottomPath := filepath.Join(dir, tag+"-bottom.erofs")
	if !buildMkfsErofs(t, bottomPath, bottom) {
		t.Log("mkfs.erofs not found; building the bottom layer with go-erofs too")
		buildGoErofs(t, bottomPath, bottom)
	}
	buildGoErofs(t, filepath.Join(dir, tag+"-top.erofs"), []entry{
		{name: "etc/shared", content: "from top\n", mode: 0o644},
		{name: "only-top", content: "top\n", mode: 0o600},
	})
	garbage := bytes.Repeat([]byte("not erofs "), 8192)
	if err := os.WriteFile(filepath.Join(dir, tag+"-garbage.erofs"), garbage, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tag"), []byte(tag), 0o644); err != nil {
		t.Fatal(err)
	}

	out := runChild(t, dir)
	if !strings.Contains(out, "--- PASS: "+t.Name()) {
		t.Fatalf("child did not pass:\n%s", out)
	}
	checkNoLeaks(t, dir, tag)
}

func composeChild(t *testing.T, dir string) {
	b, err := os.ReadFile(filepath.Join(dir, "tag"))
	if err != nil {
		t.Fatal(err)
	}
	tag := string(b)
	layers := []Layer{
		{Name: "bottom", Path: filepath.Join(dir, tag+"-bottom.erofs")},
		{Name: "top", Path: filepath.Join(dir, tag+"-top.erofs")},
	}
	work, target := filepath.Join(dir, "work"), filepath.Join(dir, "root")
	r, err := Compose(RealSys(), layers, work, target)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(boundLoops(tag)); n != 2 {
		t.Errorf("%d loop devices bound to the layers, want 2", n)
	}

	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(target, p))
		if err != nil {
			t.Errorf("read %s: %v", p, err)
		}
		return string(b)
	}
	if got := read("etc/shared"); got != "from top\n" {
		t.Errorf("etc/shared = %q: the top layer must win", got)
	}
	if got := read("etc/os-release"); got != "ID=bottom\n" {
		t.Errorf("etc/os-release = %q: the bottom layer must show through", got)
	}
	if got := read("only-top"); got != "top\n" {
		t.Errorf("only-top = %q", got)
	}
	if l, err := os.Readlink(filepath.Join(target, "bin/link")); err != nil || l != "only-bottom" {
		t.Errorf("bin/link -> %q, %v", l, err)
	}
	if fi, err := os.Stat(filepath.Join(target, "bin/only-bottom")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("bin/only-bottom: %v, %v", fi, err)
	}

	// Writes land in the tmpfs upper; the layers stay read-only.
	if err := os.WriteFile(filepath.Join(target, "etc/new"), []byte("new\n"), 0o644); err != nil {
		t.Fatalf("write through the overlay: %v", err)
	}
	if err := os.WriteFile(filepath.Join(target, "etc/shared"), []byte("changed\n"), 0o644); err != nil {
		t.Fatalf("overwrite a lower file: %v", err)
	}
	if err := os.Remove(filepath.Join(target, "var/deleteme")); err != nil {
		t.Fatalf("delete a lower file: %v", err)
	}
	if got := read("etc/new"); got != "new\n" {
		t.Errorf("etc/new = %q", got)
	}
	if b, err := os.ReadFile(filepath.Join(r.UpperDir, "etc/new")); err != nil || string(b) != "new\n" {
		t.Errorf("upper etc/new = %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(target, "var/deleteme")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("deleted file still visible: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(r.LayerDirs[1], "etc/shared")); err != nil || string(b) != "from top\n" {
		t.Errorf("top layer's etc/shared = %q, %v: a write went through to a layer", b, err)
	}
	if err := os.WriteFile(filepath.Join(r.LayerDirs[0], "x"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("write into a layer mount: %v, want EROFS", err)
	}

	mi := strings.Join(mountinfoLines(t, dir), "\n")
	for _, want := range []string{" - erofs ", " - overlay "} {
		if !strings.Contains(mi, want) {
			t.Errorf("mountinfo has no%s mount under %s:\n%s", want, dir, mi)
		}
	}

	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if left := mountinfoLines(t, dir); len(left) != 0 {
		t.Errorf("mounts left after Close: %q", left)
	}

	// A failure halfway (the second image is not erofs) unmounts the first
	// layer again and releases both loop devices.
	bad := []Layer{layers[0], {Name: "garbage", Path: filepath.Join(dir, tag+"-garbage.erofs")}}
	if _, err := Compose(RealSys(), bad, filepath.Join(dir, "work2"), filepath.Join(dir, "root2")); err == nil ||
		!strings.Contains(err.Error(), "layer 1 (garbage)") {
		t.Fatalf("Compose with a garbage layer: err = %v", err)
	}
	if left := mountinfoLines(t, dir); len(left) != 0 {
		t.Errorf("mounts left after a failed Compose: %q", left)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(boundLoops(tag)) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond) // polls the kernel releasing loop devices
	}
	if b := boundLoops(tag); len(b) > 0 {
		t.Errorf("loop devices left bound: %q", b)
	}

	// removeOnFS does not cross into a mount inside the tree.
	tree := filepath.Join(dir, "tree")
	mnt := filepath.Join(tree, "mnt")
	if err := os.MkdirAll(filepath.Join(tree, "a/b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, "a/b/f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(mnt, 0)
	if err := os.WriteFile(filepath.Join(mnt, "keep"), []byte("k"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := removeOnFS(tree); err != nil {
		t.Fatalf("removeOnFS: %v", err)
	}
	if _, err := os.Stat(filepath.Join(mnt, "keep")); err != nil {
		t.Errorf("removeOnFS crossed into a mount: %v", err)
	}
	if _, err := os.Stat(filepath.Join(tree, "a")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("removeOnFS left %s/a: %v", tree, err)
	}
}

// TestSwitchPrivileged does a whole switch: in the child's private mount
// namespace it builds a stand-in initramfs (a tmpfs it chroots into, with
// /dev, /proc, /sys, /run and /tmp mounted), composes a root from two
// images, and calls Switch, which execs the new root's /sbin/init, a
// busybox shell script that reports what it sees.
func TestSwitchPrivileged(t *testing.T) {
	if isChild(t) {
		switchChild(t, os.Getenv(dirEnv))
		return
	}
	requirePrivileges(t)
	bb := staticBusybox(t)
	busybox, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tag := uniqueTag(t)
	const initScript = `#!/bin/sh
echo "init-argv: $0 $*"
. /etc/os-release
echo "os-release: $ID $VERSION_ID"
echo "top: $(cat /etc/top)"
echo "agent: $(cat /run/tether/bin/tether-agent)"
echo "root-fstype: $(awk '$5 == "/" { for (i = 6; i <= NF; i++) if ($i == "-") print $(i+1) }' /proc/self/mountinfo)"
echo "old-root: $(ls -A /run/peek | tr '\n' ' ')"
echo "layers: $(ls /run/tether/rootfs/layers | tr '\n' ' ')"
for d in dev proc sys run; do [ -n "$(ls -A /$d)" ] && echo "moved: $d"; done
echo hi > /written && echo "write: $(cat /written)"
echo SWITCH-TEST-DONE
`
	base := []entry{
		{name: "bin/busybox", content: string(busybox), mode: 0o755},
		{name: "bin/sh", link: "busybox"},
		{name: "sbin/init", content: initScript, mode: 0o755},
		{name: "etc/os-release", content: "ID=switchtest\nVERSION_ID=1\n", mode: 0o644},
		{name: "dev", dir: true}, {name: "proc", dir: true}, {name: "sys", dir: true}, {name: "run", dir: true},
	}
	basePath := filepath.Join(dir, tag+"-base.erofs")
	if !buildMkfsErofs(t, basePath, base) {
		buildGoErofs(t, basePath, base)
	}
	buildGoErofs(t, filepath.Join(dir, tag+"-top.erofs"), []entry{
		{name: "etc/os-release", content: "ID=switchtest\nVERSION_ID=2\n", mode: 0o644},
		{name: "etc/top", content: "top layer", mode: 0o644},
	})
	if err := os.WriteFile(filepath.Join(dir, "tag"), []byte(tag), 0o644); err != nil {
		t.Fatal(err)
	}

	out := runChild(t, dir)
	for _, want := range []string{
		"init-argv: /sbin/init from-test",
		"os-release: switchtest 2",
		"top: top layer",
		"agent: fake agent binary",
		"root-fstype: overlay",
		"old-root: newroot \n", // everything else on the old root was deleted
		"layers: 0 1 \n",
		"moved: dev", "moved: proc", "moved: sys", "moved: run",
		"write: hi",
		"SWITCH-TEST-DONE",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the switched root's init did not print %q; output:\n%s", want, out)
		}
	}
	checkNoLeaks(t, dir, tag)
}

func switchChild(t *testing.T, dir string) {
	b, err := os.ReadFile(filepath.Join(dir, "tag"))
	if err != nil {
		t.Fatal(err)
	}
	tag := string(b)
	root := filepath.Join(dir, "initramfs")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(root, 0o755))
	must(unix.Mount("tmpfs", root, "tmpfs", 0, "mode=0755"))
	for _, d := range []string{"dev", "proc", "sys", "run", "tmp", "images", "newroot"} {
		must(os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	must(unix.Mount("/dev", filepath.Join(root, "dev"), "", unix.MS_BIND|unix.MS_REC, ""))
	must(unix.Mount("proc", filepath.Join(root, "proc"), "proc", 0, ""))
	must(unix.Mount("sysfs", filepath.Join(root, "sys"), "sysfs", 0, ""))
	must(unix.Mount("tmpfs", filepath.Join(root, "run"), "tmpfs", 0, "mode=0755"))
	must(unix.Mount("tmpfs", filepath.Join(root, "tmp"), "tmpfs", 0, "mode=1777"))
	// A window onto the initramfs that survives the switch, so the new
	// root's init can check what was deleted.
	must(os.MkdirAll(filepath.Join(root, "run/peek"), 0o755))
	must(unix.Mount(root, filepath.Join(root, "run/peek"), "", unix.MS_BIND, ""))
	for _, name := range []string{"base", "top"} {
		img, err := os.ReadFile(filepath.Join(dir, tag+"-"+name+".erofs"))
		must(err)
		must(os.WriteFile(filepath.Join(root, "images", tag+"-"+name+".erofs"), img, 0o644))
	}
	must(os.WriteFile(filepath.Join(root, "init"), []byte("fake agent binary"), 0o755))

	must(unix.Chroot(root))
	must(unix.Chdir("/"))

	sys := RealSys()
	_, err = Compose(sys, []Layer{
		{Name: "base", Path: "/images/" + tag + "-base.erofs"},
		{Name: "top", Path: "/images/" + tag + "-top.erofs"},
	}, "/run/tether/rootfs", "/newroot")
	must(err)
	err = Switch(sys, "/newroot", SwitchOptions{
		AgentPath: "/init",
		InitArgs:  []string{"from-test"},
		Logf:      t.Logf,
	})
	t.Fatalf("Switch returned: %v", err)
}

// staticBusybox finds a statically linked busybox, which the switched root
// needs because it has no libc.
func staticBusybox(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("skipped: needs a static busybox (Debian: busybox-static) for the switched root's init")
	}
	f, err := elf.Open(p)
	if err != nil {
		t.Skipf("skipped: %s is not an ELF binary: %v", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			t.Skipf("skipped: %s is dynamically linked; install busybox-static", p)
		}
	}
	return p
}
