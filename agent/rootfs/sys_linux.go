package rootfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// RealSys returns the Sys that makes the real system calls.
func RealSys() Sys { return realSys{} }

type realSys struct{}

func (realSys) Mount(source, target, fstype string, flags uintptr, data string) error {
	if err := unix.Mount(source, target, fstype, flags, data); err != nil {
		return &os.PathError{Op: "mount", Path: target, Err: err}
	}
	return nil
}

func (realSys) Unmount(target string, flags int) error {
	if err := unix.Unmount(target, flags); err != nil {
		return &os.PathError{Op: "umount", Path: target, Err: err}
	}
	return nil
}

func (realSys) MkdirAll(path string, perm fs.FileMode) error { return os.MkdirAll(path, perm) }

func (realSys) IsMountPoint(path string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return false, &os.PathError{Op: "lstat", Path: path, Err: err}
	}
	if err := unix.Lstat(filepath.Join(path, ".."), &parent); err != nil {
		return false, &os.PathError{Op: "lstat", Path: path + "/..", Err: err}
	}
	// The root of the namespace (or of a chroot) is its own parent.
	return st.Dev != parent.Dev || st.Ino == parent.Ino, nil
}

func (realSys) FSType(path string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, &os.PathError{Op: "statfs", Path: path, Err: err}
	}
	return st.Type, nil
}

func (realSys) CopyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	if err := out.Close(); err != nil {
		return err
	}
	// O_CREATE's mode is filtered by the umask; the copy must be runnable.
	return os.Chmod(dst, perm)
}

func (realSys) BindFile(src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE, 0o755)
	if err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return &os.PathError{Op: "bind mount " + src + " on", Path: dst, Err: err}
	}
	return nil
}

func (realSys) RemoveOnFS(dir string) error { return removeOnFS(dir) }

func (realSys) Chdir(dir string) error {
	if err := unix.Chdir(dir); err != nil {
		return &os.PathError{Op: "chdir", Path: dir, Err: err}
	}
	return nil
}

func (realSys) Chroot(dir string) error {
	if err := unix.Chroot(dir); err != nil {
		return &os.PathError{Op: "chroot", Path: dir, Err: err}
	}
	return nil
}

func (realSys) Executable(path string) error {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o111 == 0 {
		return &os.PathError{Op: "exec", Path: path, Err: unix.EACCES}
	}
	return nil
}

func (realSys) Exec(path string, argv, env []string) error {
	if err := unix.Exec(path, argv, env); err != nil {
		return &os.PathError{Op: "exec", Path: path, Err: err}
	}
	return nil
}

func (realSys) AttachLoop(image string) (Loop, error) { return attachLoop(image) }

// loopDev holds the loop device open: with LO_FLAGS_AUTOCLEAR the kernel
// detaches the device on its last close, so the fd must stay open until a
// mount holds the device (kernel 6.1 otherwise fails the erofs mount with
// "cannot find valid erofs superblock").
type loopDev struct {
	path string
	f    *os.File
}

func (l *loopDev) Path() string { return l.path }
func (l *loopDev) Close() error { return l.f.Close() }

const loopMajor = 7

// attachLoop uses LOOP_CTL_GET_FREE + LOOP_CONFIGURE (one ioctl that sets
// the backing file and the flags atomically, kernel >= 5.8) instead of the
// older LOOP_SET_FD + LOOP_SET_STATUS64 pair, which has a window where the
// device is bound but still writable and not yet autoclearing.
func attachLoop(image string) (Loop, error) {
	backing, err := os.Open(image)
	if err != nil {
		return nil, fmt.Errorf("loop: %w", err)
	}
	defer backing.Close() // the device keeps its own reference

	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("loop: %w", err)
	}
	defer ctl.Close()

	cfg := unix.LoopConfig{Fd: uint32(backing.Fd())}
	cfg.Info.Flags = unix.LO_FLAGS_READ_ONLY | unix.LO_FLAGS_AUTOCLEAR
	copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], image)

	// Another process may take the free device between GET_FREE and
	// CONFIGURE (EBUSY); ask again a few times.
	var lastErr error
	for range 16 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("loop: LOOP_CTL_GET_FREE: %w", err)
		}
		path := fmt.Sprintf("/dev/loop%d", n)
		dev, err := openLoop(path, n)
		if err != nil {
			return nil, fmt.Errorf("loop: %w", err)
		}
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if err == nil {
			return &loopDev{path: path, f: dev}, nil
		}
		dev.Close()
		if !errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("loop: LOOP_CONFIGURE %s with %s: %w", path, image, err)
		}
		lastErr = err
	}
	return nil, fmt.Errorf("loop: no free loop device for %s: %w", image, lastErr)
}

// openLoop opens the device node, creating it when devtmpfs has not (a
// /dev that is not devtmpfs, as in some containers).
func openLoop(path string, n int) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		if err := unix.Mknod(path, unix.S_IFBLK|0o600, int(unix.Mkdev(loopMajor, uint32(n)))); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, &os.PathError{Op: "mknod", Path: path, Err: err}
		}
		f, err = os.OpenFile(path, os.O_RDONLY, 0)
	}
	return f, err
}

// removeOnFS deletes the contents of dir without crossing into other
// mounts, the way switch_root frees the initramfs: it works on directory
// file descriptors (openat/unlinkat with O_NOFOLLOW), so a symlink or a
// rename cannot redirect it outside dir.
func removeOnFS(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return &os.PathError{Op: "fstat", Path: dir, Err: err}
	}
	return removeChildren(fd, dir, st.Dev)
}

// removeChildren takes ownership of fd.
func removeChildren(fd int, path string, dev uint64) error {
	d := os.NewFile(uintptr(fd), path)
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	var errs []error
	for _, name := range names {
		child := filepath.Join(path, name)
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			errs = append(errs, &os.PathError{Op: "lstat", Path: child, Err: err})
			continue
		}
		if st.Dev != dev {
			continue // a mount point: leave it and everything in it
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			cfd, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				errs = append(errs, &os.PathError{Op: "open", Path: child, Err: err})
				continue
			}
			if err := removeChildren(cfd, child, dev); err != nil {
				errs = append(errs, err)
			}
			// A directory that holds a mount point cannot go; that is
			// expected (the new root's mount point, for one).
			if err := unix.Unlinkat(fd, name, unix.AT_REMOVEDIR); err != nil &&
				!errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EBUSY) {
				errs = append(errs, &os.PathError{Op: "rmdir", Path: child, Err: err})
			}
			continue
		}
		if err := unix.Unlinkat(fd, name, 0); err != nil {
			errs = append(errs, &os.PathError{Op: "unlink", Path: child, Err: err})
		}
	}
	return errors.Join(errs...)
}
