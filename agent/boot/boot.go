// Package boot is the early setup a netboot PID 1 does before anything else:
// pseudo filesystems, kernel modules, network. It talks to the kernel only
// through syscalls (no mount(8), no modprobe), because the initramfs has no
// libc and no tools the agent may rely on.
package boot

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Config says what Setup does. Every field has a usable zero value.
type Config struct {
	// ModulesDir holds the kernel modules; default /lib/modules/<uname -r>.
	ModulesDir string
	// ModuleOrderFile lists the .ko files to load, in order (see
	// ReadModuleOrder). Default ModulesDir/tether.order; when defaulted and
	// absent (not a netboot initramfs) no modules are loaded.
	ModuleOrderFile string
	// Cmdline is the kernel command line; default the contents of
	// /proc/cmdline, read once /proc is mounted.
	Cmdline string
	// Logf reports progress; nil discards it.
	Logf func(format string, args ...any)
	// DHCP is the DHCP client; default UrootDHCP{}.
	DHCP DHCP
}

// Setup mounts devtmpfs on /dev (with devpts on /dev/pts), proc on /proc,
// sysfs on /sys and tmpfs on /run and /tmp, loads the kernel modules in
// order and brings the network up as the command line asks (ip=, BOOTIF=;
// DHCP when neither is given).
// Mounts that are already in place are left alone, so Setup may run again
// after a restart.
func Setup(ctx context.Context, cfg Config) error {
	logf := cfg.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	start := time.Now()
	if err := MountPseudoFilesystems(); err != nil {
		return err
	}
	logf("boot: pseudo filesystems mounted in %v", time.Since(start).Round(time.Millisecond))

	cmdline := cfg.Cmdline
	if cmdline == "" {
		b, err := os.ReadFile("/proc/cmdline")
		if err != nil {
			return fmt.Errorf("boot: read kernel command line: %w", err)
		}
		cmdline = strings.TrimSpace(string(b))
	}

	t := time.Now()
	n, err := loadModuleOrder(cfg, logf)
	if err != nil {
		return err
	}
	logf("boot: %d kernel modules loaded in %v", n, time.Since(t).Round(time.Millisecond))

	t = time.Now()
	summary, err := ConfigureNetwork(ctx, cmdline, NetworkOptions{DHCP: cfg.DHCP, Logf: logf})
	if err != nil {
		return err
	}
	logf("boot: network up: %s in %v", summary, time.Since(t).Round(time.Millisecond))
	return nil
}

func loadModuleOrder(cfg Config, logf func(string, ...any)) (int, error) {
	dir := cfg.ModulesDir
	if dir == "" {
		rel, err := KernelRelease()
		if err != nil {
			return 0, err
		}
		dir = filepath.Join("/lib/modules", rel)
	}
	orderFile := cfg.ModuleOrderFile
	if orderFile == "" {
		orderFile = filepath.Join(dir, ModuleOrderName)
		if _, err := os.Stat(orderFile); errors.Is(err, fs.ErrNotExist) {
			logf("boot: no module order file %s; loading no modules", orderFile)
			return 0, nil
		}
	}
	f, err := os.Open(orderFile)
	if err != nil {
		return 0, fmt.Errorf("boot: module order: %w", err)
	}
	defer f.Close()
	order, err := ReadModuleOrder(f, dir)
	if err != nil {
		return 0, fmt.Errorf("%w (in %s)", err, orderFile)
	}
	for _, path := range order {
		t := time.Now()
		if err := loadModule(path); err != nil {
			return 0, err
		}
		// Name the slow ones: a driver that probes hardware shows up here.
		if d := time.Since(t); d > 100*time.Millisecond {
			logf("boot: module %s took %v", strings.TrimSuffix(filepath.Base(path), ".ko"), d.Round(time.Millisecond))
		}
	}
	return len(order), nil
}

// KernelRelease returns uname -r.
func KernelRelease() (string, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", fmt.Errorf("boot: uname: %w", err)
	}
	return unix.ByteSliceToString(u.Release[:]), nil
}

type pseudoMount struct {
	source, target, fstype string
	flags                  uintptr
	data                   string
	// fallback is the data to retry with when the kernel refuses data
	// (an option it was built without).
	fallback string
}

// pseudoMounts is the order Setup mounts them in; /dev/pts needs /dev.
var pseudoMounts = []pseudoMount{
	{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755", ""},
	{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "gid=5,mode=0620,ptmxmode=0666", ""},
	{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "", ""},
	{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "", ""},
	// /run holds the module cache: verified erofs images the root is
	// mounted from. Huge pages make writing a module ~4x cheaper (a
	// 64 MiB module is 32 pages, not 16,384), so fetch + verify runs at
	// wire speed. Kernels without transparent huge pages get a plain tmpfs.
	{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, RunMountData, "mode=0755"},
	{"tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777", ""},
}

// RunMountData is how /run is mounted on a node; the fetch benchmark
// mounts its cache the same way.
const RunMountData = "mode=0755,huge=within_size"

// MountPseudoFilesystems does the mounting part of Setup. The kernel does
// not mount devtmpfs for an initramfs (CONFIG_DEVTMPFS_MOUNT only applies to
// a real root), so without this there is no /dev/loop-control.
func MountPseudoFilesystems() error {
	for _, m := range pseudoMounts {
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			return fmt.Errorf("boot: mkdir %s: %w", m.target, err)
		}
		mounted, err := isMountPoint(m.target)
		if err != nil {
			return fmt.Errorf("boot: %s: %w", m.target, err)
		}
		if mounted {
			continue
		}
		err = unix.Mount(m.source, m.target, m.fstype, m.flags, m.data)
		if errors.Is(err, unix.EINVAL) && m.fallback != "" {
			err = unix.Mount(m.source, m.target, m.fstype, m.flags, m.fallback)
		}
		if err != nil {
			return fmt.Errorf("boot: mount %s on %s: %w", m.fstype, m.target, err)
		}
	}
	// devtmpfs has no /dev/fd and friends; shells and some programs expect them.
	for name, target := range map[string]string{
		"/dev/fd": "/proc/self/fd", "/dev/stdin": "/proc/self/fd/0",
		"/dev/stdout": "/proc/self/fd/1", "/dev/stderr": "/proc/self/fd/2",
	} {
		if err := os.Symlink(target, name); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("boot: symlink %s: %w", name, err)
		}
	}
	// securityfs holds the firmware's TPM event log, which an attested
	// enrollment replays. A kernel built without it has no mount point
	// under /sys; such a node attests without a log.
	const security = "/sys/kernel/security"
	if _, err := os.Stat(security); err == nil {
		if mounted, err := isMountPoint(security); err == nil && !mounted {
			if err := unix.Mount("securityfs", security, "securityfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
				return fmt.Errorf("boot: mount securityfs on %s: %w", security, err)
			}
		}
	}
	return nil
}

// isMountPoint reports whether path is the root of a mount: its device
// differs from its parent's. (A bind mount of the same filesystem is not
// detected; Setup never makes one.)
func isMountPoint(path string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return false, err
	}
	if err := unix.Lstat(filepath.Join(path, ".."), &parent); err != nil {
		return false, err
	}
	return st.Dev != parent.Dev || st.Ino == parent.Ino, nil
}
