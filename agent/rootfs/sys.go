// Package rootfs composes the node's root filesystem from verified erofs
// layers (loop devices, read-only erofs mounts, an overlay with a tmpfs
// upper) and switches into it from the initramfs the way switch_root does.
//
// Every privileged call goes through Sys, so the order of operations and
// the cleanup on failure are unit-tested with a fake, and the real calls
// are tested as root inside a private mount namespace.
package rootfs

import "io/fs"

// Sys is the set of privileged operations Compose and Switch need.
// RealSys implements it with syscalls; tests use a fake.
type Sys interface {
	Mount(source, target, fstype string, flags uintptr, data string) error
	Unmount(target string, flags int) error
	MkdirAll(path string, perm fs.FileMode) error
	// AttachLoop binds a free loop device, read-only and auto-clearing, to
	// the image file. The returned Loop must stay open until the device is
	// mounted: closing it before that tears the device down.
	AttachLoop(image string) (Loop, error)
	// IsMountPoint reports whether path is the root of a mount.
	IsMountPoint(path string) (bool, error)
	// FSType returns statfs(2)'s f_type for path.
	FSType(path string) (int64, error)
	// CopyFile copies src to dst with mode perm, creating dst's parents.
	CopyFile(src, dst string, perm fs.FileMode) error
	// BindFile makes dst show the file src with a bind mount, creating dst
	// (empty, as the mount point) and its parents.
	BindFile(src, dst string) error
	// RemoveOnFS deletes everything below dir that is on dir's own
	// filesystem; it never descends into another mount and never follows
	// symlinks. dir itself stays.
	RemoveOnFS(dir string) error
	Chdir(dir string) error
	Chroot(dir string) error
	// Executable reports (as nil) whether path names an executable file.
	Executable(path string) error
	// Exec replaces the process; it returns only on failure.
	Exec(path string, argv, env []string) error
}

// Loop is an attached loop device.
type Loop interface {
	// Path is the block device, e.g. /dev/loop3.
	Path() string
	// Close releases this process's hold on the device. With autoclear the
	// kernel detaches it once nothing (no mount) uses it any more.
	Close() error
}
