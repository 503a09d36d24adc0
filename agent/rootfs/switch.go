package rootfs

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// DefaultAgentDest is where Switch puts the agent's copy, as seen from the
// new root. It is on the /run tmpfs, which the switch carries over, so the
// agent that the new root's init starts finds its binary, key, certificate
// and state beside each other under /run/tether.
const DefaultAgentDest = "/run/tether/bin/tether-agent"

// ErrNoInit is returned by Switch when the switch succeeded but the new root
// has no init: the caller is now PID 1 in the new root and stays on as the
// supervisor.
var ErrNoInit = errors.New("rootfs: the new root has no init")

// SwitchOptions tunes Switch. The zero value is what a netboot wants.
type SwitchOptions struct {
	// AgentPath is the binary to copy into the new root (e.g. "/init" or
	// os.Executable()); empty copies nothing.
	AgentPath string
	// AgentDest is the copy's path inside the new root; default DefaultAgentDest.
	AgentDest string
	// Moves are the mounts carried into the new root with MS_MOVE; default
	// /dev, /proc, /sys, /run. One that is not a mount point is skipped.
	Moves []string
	// Detach are mounts of the initramfs that are lazily unmounted rather
	// than carried over (their contents are initramfs-only scratch); default /tmp.
	Detach []string
	// Init lists the init candidates, tried in order; default /sbin/init.
	Init []string
	// InitArgs are passed to init after argv[0].
	InitArgs []string
	// Env is init's environment; default a minimal PATH and TERM.
	Env []string
	// BeforeExec, when set, runs in the new root right before its init is
	// exec'd (not when there is no init to exec).
	BeforeExec func()
	// Logf reports progress and non-fatal problems; nil discards them.
	Logf func(format string, args ...any)
}

func (o *SwitchOptions) defaults() {
	if o.AgentDest == "" {
		o.AgentDest = DefaultAgentDest
	}
	if o.Moves == nil {
		o.Moves = []string{"/dev", "/proc", "/sys", "/run"}
	}
	if o.Detach == nil {
		o.Detach = []string{"/tmp"}
	}
	if len(o.Init) == 0 {
		o.Init = []string{"/sbin/init"}
	}
	if o.Env == nil {
		o.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "TERM=linux", "HOME=/"}
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
}

// Switch does what switch_root does from an initramfs, where pivot_root(2)
// is not allowed: it puts the agent binary into the new root (a bind mount,
// else a copy), moves /dev,
// /proc, /sys and /run into target, deletes the initramfs's files (never
// crossing into other mounts) so they stop pinning RAM, moves target onto /,
// chroots into it and execs its init.
//
// The caller must be PID 1 for init to become PID 1. On success Switch does
// not return. When the new root has no init it returns ErrNoInit with the
// switch complete: the caller is in the new root and stays on as the
// supervisor. Checks that make the switch unsafe (/ is not an initramfs,
// target is not a mount, target inside a moved mount) fail before anything
// changes; a later error leaves the system partly switched (some mounts
// moved), and the caller should report it and stop.
func Switch(sys Sys, target string, opts SwitchOptions) error {
	opts.defaults()
	if err := checkSwitchArgs(sys, target, opts); err != nil {
		return err
	}

	// Place the agent before /run moves: put into the current /run it
	// rides along and lands at the same path in the new root. Without a
	// /run mount it goes into the new root directly.
	if opts.AgentPath != "" {
		dst := filepath.Join(target, opts.AgentDest)
		for _, m := range opts.Moves {
			if under(opts.AgentDest, m) {
				if ok, _ := sys.IsMountPoint(m); ok {
					dst = opts.AgentDest
				}
			}
		}
		if err := placeAgent(sys, opts, dst); err != nil {
			return err
		}
	}

	for _, m := range opts.Moves {
		ok, err := sys.IsMountPoint(m)
		if err != nil || !ok {
			opts.Logf("rootfs: %s is not a mount point, not moved (%v)", m, err)
			continue
		}
		dst := filepath.Join(target, m)
		if err := sys.MkdirAll(dst, 0o755); err != nil {
			return fmt.Errorf("rootfs: %w", err)
		}
		if err := sys.Mount(m, dst, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("rootfs: move %s to %s: %w", m, dst, err)
		}
	}
	for _, m := range opts.Detach {
		if ok, _ := sys.IsMountPoint(m); ok {
			if err := sys.Unmount(m, unix.MNT_DETACH); err != nil {
				opts.Logf("rootfs: detach %s: %v", m, err)
			}
		}
	}

	// Free the initramfs. A failure here costs RAM, not correctness.
	if err := sys.RemoveOnFS("/"); err != nil {
		opts.Logf("rootfs: free initramfs: %v", err)
	}

	if err := sys.Chdir(target); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	if err := sys.Mount(target, "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("rootfs: move %s onto /: %w", target, err)
	}
	if err := sys.Chroot("."); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	if err := sys.Chdir("/"); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}

	var tried []string
	for _, init := range opts.Init {
		if err := sys.Executable(init); err != nil {
			tried = append(tried, err.Error())
			continue
		}
		if opts.BeforeExec != nil {
			opts.BeforeExec()
		}
		opts.Logf("rootfs: switched root; exec %s", init)
		argv := append([]string{init}, opts.InitArgs...)
		if err := sys.Exec(init, argv, opts.Env); err != nil {
			return fmt.Errorf("rootfs: exec %s: %w", init, err)
		}
		return nil // only a fake Exec returns
	}
	return fmt.Errorf("%w (%s)", ErrNoInit, strings.Join(tried, "; "))
}

// placeAgent bind-mounts the agent binary at dst rather than copying it:
// the mount moves into the new root with the mount it sits in, and keeps
// the initramfs's inode (and its pages, already in memory) alive after
// the initramfs's files are deleted. A 10 MB copy took a second of a
// loaded TCG guest's boot. A kernel that refuses the bind gets a copy.
func placeAgent(sys Sys, opts SwitchOptions, dst string) error {
	err := sys.BindFile(opts.AgentPath, dst)
	if err == nil {
		return nil
	}
	opts.Logf("rootfs: bind %s on %s: %v; copying it instead", opts.AgentPath, dst, err)
	if err := sys.CopyFile(opts.AgentPath, dst, 0o755); err != nil {
		return fmt.Errorf("rootfs: copy agent to %s: %w", dst, err)
	}
	return nil
}

func checkSwitchArgs(sys Sys, target string, opts SwitchOptions) error {
	if !filepath.IsAbs(target) || filepath.Clean(target) != target || target == "/" {
		return fmt.Errorf("rootfs: switch target %q must be a clean absolute path other than /", target)
	}
	for _, m := range opts.Moves {
		if under(target, m) {
			return fmt.Errorf("rootfs: switch target %s is inside %s, which is moved into it", target, m)
		}
	}
	if !filepath.IsAbs(opts.AgentDest) {
		return fmt.Errorf("rootfs: agent destination %q must be absolute", opts.AgentDest)
	}
	// Deleting every file on / is right for an initramfs and a disaster
	// anywhere else; refuse unless / is the initramfs (ramfs or tmpfs).
	typ, err := sys.FSType("/")
	if err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	if typ != unix.RAMFS_MAGIC && typ != unix.TMPFS_MAGIC {
		return fmt.Errorf("rootfs: refusing to switch root: / is not an initramfs (filesystem type %#x)", typ)
	}
	ok, err := sys.IsMountPoint(target)
	if err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	if !ok {
		return fmt.Errorf("rootfs: switch target %s is not a mount point (Compose it first)", target)
	}
	return nil
}

// under reports whether path is dir or inside it.
func under(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, strings.TrimSuffix(dir, "/")+"/")
}
