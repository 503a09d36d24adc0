package rootfs

import (
	"os"
	"path/filepath"
	"testing"
)

// removeOnFS must empty the tree without following symlinks out of it.
// (Not crossing mount points is checked by the privileged test, which can
// mount something inside the tree.)
func TestRemoveOnFSKeepsSymlinkTargets(t *testing.T) {
	base := t.TempDir()
	tree := filepath.Join(base, "initramfs")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{
		filepath.Join(tree, "bin"), filepath.Join(tree, "lib/modules/x/kernel"), filepath.Join(tree, "empty"), outside,
	} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p string) {
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(tree, "init"))
	write(filepath.Join(tree, "bin/busybox"))
	write(filepath.Join(tree, "lib/modules/x/kernel/a.ko"))
	write(filepath.Join(outside, "keep"))
	for link, target := range map[string]string{
		"bin/sh":      "busybox",
		"outside-dir": outside,
		"outside-abs": filepath.Join(outside, "keep"),
		"dangling":    "/nonexistent",
	} {
		if err := os.Symlink(target, filepath.Join(tree, link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := removeOnFS(tree); err != nil {
		t.Fatal(err)
	}
	left, err := os.ReadDir(tree)
	if err != nil {
		t.Fatalf("the tree's root must stay: %v", err)
	}
	if len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
	if _, err := os.Stat(filepath.Join(outside, "keep")); err != nil {
		t.Errorf("followed a symlink out of the tree: %v", err)
	}
}
