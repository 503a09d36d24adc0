package rootfs

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"golang.org/x/sys/unix"
)

// fakeSys records every call as one line and keeps just enough state (mount
// table, open loop devices) to check ordering and cleanup. failOn makes the
// first call whose line starts with the prefix fail.
type fakeSys struct {
	calls     []string
	failOn    string
	failErr   error
	mounted   map[string]string // target -> source
	openLoops map[string]bool
	nextLoop  int
	mountPts  map[string]bool // answered by IsMountPoint, besides mounted
	fsType    int64
	execs     map[string]bool // paths Executable accepts
}

func newFakeSys() *fakeSys {
	return &fakeSys{
		mounted:   map[string]string{},
		openLoops: map[string]bool{},
		mountPts:  map[string]bool{},
		fsType:    unix.TMPFS_MAGIC,
		execs:     map[string]bool{},
	}
}

func (f *fakeSys) record(format string, args ...any) error {
	line := fmt.Sprintf(format, args...)
	f.calls = append(f.calls, line)
	if f.failOn != "" && strings.HasPrefix(line, f.failOn) {
		f.failOn = ""
		if f.failErr != nil {
			return f.failErr
		}
		return errors.New("injected failure")
	}
	return nil
}

func (f *fakeSys) Mount(source, target, fstype string, flags uintptr, data string) error {
	desc := fstype
	if flags&unix.MS_MOVE != 0 {
		desc = "move"
	}
	if flags&unix.MS_RDONLY != 0 {
		desc += ",ro"
	}
	if err := f.record("mount %s %s %s %s", desc, source, target, data); err != nil {
		return err
	}
	if flags&unix.MS_MOVE != 0 {
		delete(f.mounted, source)
		delete(f.mountPts, source)
	}
	f.mounted[target] = source
	return nil
}

func (f *fakeSys) Unmount(target string, flags int) error {
	kind := "umount"
	if flags&unix.MNT_DETACH != 0 {
		kind = "umount-lazy"
	}
	if err := f.record("%s %s", kind, target); err != nil {
		return err
	}
	if _, ok := f.mounted[target]; !ok && !f.mountPts[target] {
		return unix.EINVAL
	}
	delete(f.mounted, target)
	delete(f.mountPts, target)
	return nil
}

func (f *fakeSys) MkdirAll(path string, perm fs.FileMode) error {
	return f.record("mkdir %s", path)
}

type fakeLoop struct {
	f    *fakeSys
	path string
}

func (l *fakeLoop) Path() string { return l.path }
func (l *fakeLoop) Close() error {
	delete(l.f.openLoops, l.path)
	return l.f.record("close %s", l.path)
}

func (f *fakeSys) AttachLoop(image string) (Loop, error) {
	if err := f.record("loop %s", image); err != nil {
		return nil, err
	}
	path := fmt.Sprintf("/dev/loop%d", f.nextLoop)
	f.nextLoop++
	f.openLoops[path] = true
	return &fakeLoop{f: f, path: path}, nil
}

func (f *fakeSys) IsMountPoint(path string) (bool, error) {
	_, ok := f.mounted[path]
	return ok || f.mountPts[path], nil
}

func (f *fakeSys) FSType(path string) (int64, error) { return f.fsType, nil }

func (f *fakeSys) CopyFile(src, dst string, perm fs.FileMode) error {
	return f.record("copy %s %s %o", src, dst, perm)
}

func (f *fakeSys) BindFile(src, dst string) error {
	return f.record("bind %s %s", src, dst)
}

func (f *fakeSys) RemoveOnFS(dir string) error { return f.record("remove %s", dir) }
func (f *fakeSys) Chdir(dir string) error      { return f.record("chdir %s", dir) }
func (f *fakeSys) Chroot(dir string) error     { return f.record("chroot %s", dir) }

func (f *fakeSys) Executable(path string) error {
	if f.execs[path] {
		return nil
	}
	return fmt.Errorf("stat %s: %w", path, fs.ErrNotExist)
}

func (f *fakeSys) Exec(path string, argv, env []string) error {
	return f.record("exec %s", strings.Join(argv, " "))
}
