package initramfs

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// DefaultModules are the kernel modules a netboot node needs on Debian's
// cloud kernel: virtio-rng (the agent generates its key early in boot,
// and without host entropy the CRNG takes over a second to be ready under
// TCG), the virtio network and block drivers and their PCI
// transport, erofs + overlay + loop for the root, and qemu_fw_cfg for the
// enrollment data QEMU passes, and button + evdev so the agent hears the ACPI
// power button (a provider's graceful stop). Their dependencies come from the kernel's
// metadata.
var DefaultModules = []string{"virtio_rng", "virtio_net", "virtio_pci", "virtio_blk", "virtio_mmio", "erofs", "overlay", "loop", "qemu_fw_cfg", "button", "evdev"}

// DefaultSkip are modules never shipped: crc32c-intel needs SSE4.2, which
// QEMU's default TCG CPU lacks (it fails to load, and the generic crc32c
// built into the kernel serves libcrc32c instead).
var DefaultSkip = []string{"crc32c_intel"}

// ModuleOrder asks modprobe for the load order of modules and their
// dependencies (modprobe -d root -S release --show-depends), in the
// kernel's own terms, and returns the .ko paths relative to
// root/lib/modules/<release>, each once, dependencies first.
func ModuleOrder(root, release string, modules, skip []string) ([]string, error) {
	root, err := filepath.Abs(root) // modprobe prints absolute paths
	if err != nil {
		return nil, fmt.Errorf("initramfs: %w", err)
	}
	modDir := filepath.Join(root, "lib", "modules", release)
	if _, err := os.Stat(filepath.Join(modDir, "modules.dep.bin")); err != nil {
		// The Debian package ships no depmod output; fetch-kernel.sh makes
		// it, but a hand-made cache may lack it.
		if out, err := exec.Command("depmod", "-b", root, release).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("initramfs: depmod -b %s %s: %v: %s", root, release, err, out)
		}
	}
	var (
		order []string
		seen  = map[string]bool{}
	)
	for _, m := range modules {
		cmd := exec.Command("modprobe", "-d", root, "-S", release, "--show-depends", m)
		cmd.Env = append(os.Environ(), "LC_ALL=C")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("initramfs: modprobe --show-depends %s: %v: %s", m, err, strings.TrimSpace(stderr.String()))
		}
		paths, err := parseShowDepends(out, modDir, skip)
		if err != nil {
			return nil, fmt.Errorf("initramfs: module %s: %w", m, err)
		}
		for _, p := range paths {
			if !seen[p] {
				seen[p] = true
				order = append(order, p)
			}
		}
	}
	return order, nil
}

// parseShowDepends reads modprobe --show-depends output: "insmod PATH" for
// each module to load (dependencies first), "builtin NAME" for those built
// into the kernel. Module parameters on an insmod line are refused: the
// order file has no place for them and dropping them silently would boot a
// differently configured module.
func parseShowDepends(out []byte, modDir string, skip []string) ([]string, error) {
	var paths []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		switch fields[0] {
		case "builtin":
			continue
		case "insmod":
		default:
			return nil, fmt.Errorf("unexpected modprobe output %q", sc.Text())
		}
		if len(fields) != 2 {
			return nil, fmt.Errorf("module parameters are not supported: %q", sc.Text())
		}
		rel, err := filepath.Rel(modDir, fields[1])
		if err != nil || strings.HasPrefix(rel, "..") {
			return nil, fmt.Errorf("module %s is outside %s", fields[1], modDir)
		}
		if !strings.HasSuffix(rel, ".ko") {
			return nil, fmt.Errorf("module %s is compressed; the agent loads plain .ko files", rel)
		}
		if skipped(rel, skip) {
			continue
		}
		paths = append(paths, rel)
	}
	return paths, sc.Err()
}

// skipped compares module names the way the kernel does, '-' and '_' alike.
func skipped(rel string, skip []string) bool {
	name := strings.ReplaceAll(strings.TrimSuffix(filepath.Base(rel), ".ko"), "-", "_")
	for _, s := range skip {
		if strings.ReplaceAll(s, "-", "_") == name {
			return true
		}
	}
	return false
}

// FormatOrder renders the order file the agent reads (agent/boot's
// ReadModuleOrder): a comment saying where it came from, then one path per
// line relative to /lib/modules/<release>.
func FormatOrder(release string, modules, skip, order []string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# Kernel module load order for %s, dependencies first.\n", release)
	fmt.Fprintf(&b, "# Computed by modprobe --show-depends for: %s\n", strings.Join(modules, " "))
	if len(skip) > 0 {
		fmt.Fprintf(&b, "# Left out: %s\n", strings.Join(skip, " "))
	}
	for _, p := range order {
		b.WriteString(p)
		b.WriteByte('\n')
	}
	return b.Bytes()
}
