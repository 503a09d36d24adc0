package rootfs

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Layer is a verified erofs image file.
type Layer struct {
	Name string // for messages, e.g. "base:1"
	Path string // the image file
}

// Root is a composed root filesystem. Close tears it down.
type Root struct {
	// Target is where the overlay is mounted.
	Target string
	// LayerDirs are the read-only layer mounts, bottom first.
	LayerDirs []string
	// UpperDir and WorkDir are the overlay's writable directories, on a tmpfs.
	UpperDir, WorkDir string

	sys    Sys
	mounts []string // in mount order; unmounted in reverse
}

// Compose attaches each layer to a loop device and mounts it read-only as
// erofs under workDir/layers/<i>, mounts a tmpfs under workDir/rw for the
// overlay's upper and work directories, and mounts an overlay at target.
// Layers are given bottom first, as templates list them; overlayfs wants
// lowerdir top first, so Compose reverses them.
//
// On failure everything Compose mounted is unmounted again, so nothing is
// left half-composed.
//
// Put workDir under /run (e.g. /run/tether/rootfs) and target outside it
// (e.g. /newroot): Switch moves /run into the new root, which carries the
// layer mounts along, so they stay visible (and unmountable) after the
// switch instead of being stranded on the hidden initramfs.
func Compose(sys Sys, layers []Layer, workDir, target string) (*Root, error) {
	if err := checkComposeArgs(layers, workDir, target); err != nil {
		return nil, err
	}
	r := &Root{Target: target, sys: sys}
	fail := func(err error) (*Root, error) {
		if cerr := r.Close(); cerr != nil {
			err = fmt.Errorf("%w (cleanup: %v)", err, cerr)
		}
		return nil, err
	}

	for i, l := range layers {
		dir := filepath.Join(workDir, "layers", strconv.Itoa(i))
		if err := r.mountLayer(l, dir); err != nil {
			return fail(fmt.Errorf("rootfs: layer %d (%s): %w", i, l.Name, err))
		}
		r.LayerDirs = append(r.LayerDirs, dir)
	}

	rw := filepath.Join(workDir, "rw")
	if err := sys.MkdirAll(rw, 0o755); err != nil {
		return fail(fmt.Errorf("rootfs: %w", err))
	}
	if err := sys.Mount("tmpfs", rw, "tmpfs", 0, "mode=0755"); err != nil {
		return fail(fmt.Errorf("rootfs: mount tmpfs for the overlay's upper layer: %w", err))
	}
	r.mounts = append(r.mounts, rw)
	r.UpperDir, r.WorkDir = filepath.Join(rw, "upper"), filepath.Join(rw, "work")
	for _, d := range []string{r.UpperDir, r.WorkDir} {
		if err := sys.MkdirAll(d, 0o755); err != nil {
			return fail(fmt.Errorf("rootfs: %w", err))
		}
	}

	if err := sys.MkdirAll(target, 0o755); err != nil {
		return fail(fmt.Errorf("rootfs: %w", err))
	}
	lower := make([]string, len(r.LayerDirs))
	for i, d := range r.LayerDirs {
		lower[len(lower)-1-i] = d
	}
	opts := "lowerdir=" + strings.Join(lower, ":") + ",upperdir=" + r.UpperDir + ",workdir=" + r.WorkDir
	if len(opts) >= 4096 {
		// The kernel copies mount data into one page.
		return fail(fmt.Errorf("rootfs: overlay options are %d bytes, over the kernel's 4095: use a shorter workDir or fewer layers", len(opts)))
	}
	if err := sys.Mount("overlay", target, "overlay", 0, opts); err != nil {
		return fail(fmt.Errorf("rootfs: mount overlay on %s (%s): %w", target, opts, err))
	}
	r.mounts = append(r.mounts, target)
	return r, nil
}

func (r *Root) mountLayer(l Layer, dir string) error {
	if err := MountErofs(r.sys, l.Path, dir); err != nil {
		return err
	}
	r.mounts = append(r.mounts, dir)
	return nil
}

// MountErofs attaches image to a loop device and mounts it read-only as
// erofs at dir, creating dir. Compose uses it for each layer; the agent can
// use it for extension modules (/run/tether/ext/<name>). Unmounting dir
// (sys.Unmount) also releases the loop device, which autoclears.
func MountErofs(sys Sys, image, dir string) error {
	if err := sys.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	loop, err := sys.AttachLoop(image)
	if err != nil {
		return err
	}
	err = sys.Mount(loop.Path(), dir, "erofs", unix.MS_RDONLY, "")
	// Once mounted, the mount holds the device; before that (or if it
	// failed) closing our fd lets autoclear detach it. Either way ours goes.
	cerr := loop.Close()
	if err != nil {
		return fmt.Errorf("mount %s (%s) as erofs on %s: %w", loop.Path(), image, dir, err)
	}
	if cerr != nil {
		// Leave nothing half-done: the caller sees an error, so take the
		// mount down again.
		if uerr := sys.Unmount(dir, unix.MNT_DETACH); uerr != nil {
			return fmt.Errorf("close %s after mounting it: %w (and unmount: %v)", loop.Path(), cerr, uerr)
		}
		return fmt.Errorf("close %s after mounting it: %w", loop.Path(), cerr)
	}
	return nil
}

func checkComposeArgs(layers []Layer, workDir, target string) error {
	if len(layers) == 0 {
		return errors.New("rootfs: no layers to compose")
	}
	for name, p := range map[string]string{"workDir": workDir, "target": target} {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
			return fmt.Errorf("rootfs: %s %q must be a clean absolute path other than /", name, p)
		}
		// overlayfs splits its options on ',' and lowerdir on ':'.
		if strings.ContainsAny(p, ",:\\") {
			return fmt.Errorf("rootfs: %s %q must not contain ',', ':' or '\\'", name, p)
		}
	}
	if target == workDir || strings.HasPrefix(target, workDir+"/") || strings.HasPrefix(workDir, target+"/") {
		return fmt.Errorf("rootfs: target %q and workDir %q must not contain each other", target, workDir)
	}
	for i, l := range layers {
		if l.Path == "" {
			return fmt.Errorf("rootfs: layer %d (%s) has no image path", i, l.Name)
		}
	}
	return nil
}

// Close unmounts everything Compose mounted, newest first. A mount that is
// busy is detached lazily so that teardown always completes.
func (r *Root) Close() error {
	var errs []error
	for i := len(r.mounts) - 1; i >= 0; i-- {
		m := r.mounts[i]
		if err := r.sys.Unmount(m, 0); err != nil {
			if !errors.Is(err, unix.EBUSY) {
				errs = append(errs, err)
				continue
			}
			if err := r.sys.Unmount(m, unix.MNT_DETACH); err != nil {
				errs = append(errs, err)
			}
		}
	}
	r.mounts = nil
	if len(errs) > 0 {
		return fmt.Errorf("rootfs: teardown: %w", errors.Join(errs...))
	}
	return nil
}
