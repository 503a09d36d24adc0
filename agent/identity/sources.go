package identity

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/tetherfleet/tether/internal/seediso"
)

// Default locations.
const (
	DefaultCmdlinePath = "/proc/cmdline"
	DefaultFwCfgDir    = "/sys/firmware/qemu_fw_cfg/by_name/opt/tether"
)

// DefaultSeedDevices are the block devices a seed ISO may be attached as:
// CD-ROMs first (the usual transport), then virtio, SCSI/SATA and Xen disks.
var DefaultSeedDevices = []string{"/dev/sr*", "/dev/vd*", "/dev/sd*", "/dev/xvd*"}

// maxValueBytes bounds a single value read from fw_cfg.
const maxValueBytes = 4096

// CmdlineSource reads tether.url, tether.token and tether.ca from the
// kernel command line.
type CmdlineSource struct {
	Path string // default /proc/cmdline
}

func (CmdlineSource) Name() string { return "kernel command line" }

func (s CmdlineSource) Lookup(context.Context) (Found, bool, error) {
	path := s.Path
	if path == "" {
		path = DefaultCmdlinePath
	}
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Found{}, false, nil
	}
	if err != nil {
		return Found{}, false, fmt.Errorf("read %s: %w", path, err)
	}
	c, err := ParseTetherCmdline(string(raw))
	if err != nil {
		return Found{}, false, fmt.Errorf("%w (fix the boot entry or the provider's kernel arguments)", err)
	}
	f := Found{Fields: c.Fields}
	for _, k := range c.Unknown {
		f.Warnings = append(f.Warnings, fmt.Sprintf("kernel command line: ignoring unknown parameter %s (this agent is older than the control plane that set it?)", k))
	}
	return f, true, nil
}

// ReadCmdline parses the kernel command line at path (default
// /proc/cmdline); a missing file gives an empty Cmdline.
func ReadCmdline(path string) (Cmdline, error) {
	if path == "" {
		path = DefaultCmdlinePath
	}
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Cmdline{}, nil
	}
	if err != nil {
		return Cmdline{}, fmt.Errorf("read %s: %w", path, err)
	}
	return ParseTetherCmdline(string(raw))
}

// FwCfgSource reads QEMU fw_cfg entries opt/tether/{url,token,ca,instance}, which
// the qemu_fw_cfg kernel module exposes under sysfs.
type FwCfgSource struct {
	Dir string // default /sys/firmware/qemu_fw_cfg/by_name/opt/tether
}

func (FwCfgSource) Name() string { return "QEMU fw_cfg" }

func (s FwCfgSource) Lookup(context.Context) (Found, bool, error) {
	dir := s.Dir
	if dir == "" {
		dir = DefaultFwCfgDir
	}
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return Found{}, false, nil
	} else if err != nil {
		return Found{}, false, fmt.Errorf("%s: %w", dir, err)
	}
	var f Fields
	for _, e := range []struct {
		name string
		dst  *string
	}{{"url", &f.URL}, {"token", &f.Token}, {"ca", &f.CA}, {"instance", &f.Instance}} {
		p := filepath.Join(dir, e.name, "raw")
		v, ok, err := readValue(p)
		if err != nil {
			return Found{}, false, fmt.Errorf("cannot read %s: %w (check the VM's -fw_cfg name=opt/tether/%s options)", p, err, e.name)
		}
		if ok {
			*e.dst = v
		}
	}
	checked, err := f.check(func(field string) string { return filepath.Join(dir, field, "raw") })
	if err != nil {
		return Found{}, false, err
	}
	return Found{Fields: checked}, true, nil
}

// readValue reads one small value; a missing entry is not an error.
func readValue(path string) (string, bool, error) {
	fh, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	defer fh.Close()
	b, err := io.ReadAll(io.LimitReader(fh, maxValueBytes+1))
	if err != nil {
		return "", false, err
	}
	if len(b) > maxValueBytes {
		return "", false, fmt.Errorf("larger than %d bytes", maxValueBytes)
	}
	v := trimValue(b)
	if v == "" {
		return "", false, errors.New("empty")
	}
	return v, true, nil
}

// SeedISOSource scans block devices for a seed ISO labelled TETHERSEED.
type SeedISOSource struct {
	// Devices are glob patterns; default DefaultSeedDevices.
	Devices []string
	// Read reads one device; default seediso.Read. Tests substitute it.
	Read func(path string) (seediso.Material, error)
}

func (SeedISOSource) Name() string { return "seed ISO" }

func (s SeedISOSource) Lookup(ctx context.Context) (Found, bool, error) {
	patterns := s.Devices
	if patterns == nil {
		patterns = DefaultSeedDevices
	}
	read := s.Read
	if read == nil {
		read = seediso.Read
	}
	for _, pat := range patterns {
		paths, err := filepath.Glob(pat)
		if err != nil {
			return Found{}, false, fmt.Errorf("device pattern %q: %w", pat, err)
		}
		for _, p := range paths {
			if err := ctx.Err(); err != nil {
				return Found{}, false, err
			}
			if !isCandidate(p) {
				continue
			}
			m, err := read(p)
			var pathErr *fs.PathError
			switch {
			case errors.Is(err, seediso.ErrNotSeed):
				continue
			case errors.As(err, &pathErr):
				// An empty CD drive (ENOMEDIUM) or a device we may not open
				// cannot be our seed; the next device may be.
				continue
			case err != nil:
				return Found{}, false, fmt.Errorf("%s is labelled %s but unusable: %w (rebuild it with `tetherctl instance seed-iso`)", p, seediso.Label, err)
			}
			f := Fields{URL: m.URL, Token: m.Token, CA: m.CA}
			checked, err := f.check(func(field string) string { return p + ": " + seediso.Dir + "/" + field })
			if err != nil {
				return Found{}, false, err
			}
			return Found{Fields: checked}, true, nil
		}
	}
	return Found{}, false, nil
}

// isCandidate admits block devices, and regular files so an image can be
// pointed at directly (tests, or a loop-less debug run).
func isCandidate(p string) bool {
	fi, err := os.Stat(p)
	if err != nil {
		return false
	}
	m := fi.Mode()
	return m.IsRegular() || (m&fs.ModeDevice != 0 && m&fs.ModeCharDevice == 0)
}

// DefaultSources are the sources in the order docs/design.md §3.2 lists them.
func DefaultSources() []Source {
	return []Source{CmdlineSource{}, HandoffSource{}, FwCfgSource{}, SeedISOSource{}}
}
