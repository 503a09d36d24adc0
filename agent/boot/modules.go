package boot

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ModuleOrderName is the file name of the module load order that the
// initramfs builder writes beside the modules, at
// /lib/modules/<release>/tether.order.
const ModuleOrderName = "tether.order"

// ReadModuleOrder reads a module order file: one .ko path per line, in load
// order, relative to modulesDir unless absolute; blank lines and lines
// starting with '#' are ignored. The build computes the order from the
// kernel's own metadata (modprobe --show-depends), so the agent needs no
// modules.dep parser.
func ReadModuleOrder(r io.Reader, modulesDir string) ([]string, error) {
	var paths []string
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.ContainsAny(line, " \t") {
			return nil, fmt.Errorf("boot: module order line %d: %q: want one path per line", n, line)
		}
		if !strings.HasSuffix(line, ".ko") {
			return nil, fmt.Errorf("boot: module order line %d: %q is not an uncompressed .ko file", n, line)
		}
		if !filepath.IsAbs(line) {
			line = filepath.Join(modulesDir, line)
		}
		paths = append(paths, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("boot: read module order: %w", err)
	}
	return paths, nil
}

// LoadModules loads each module file with finit_module(2), in order. A
// module that is already loaded (or built in under the same name) is fine.
// The first failure stops the loading and names the module.
func LoadModules(order []string) error {
	for _, path := range order {
		if err := loadModule(path); err != nil {
			return err
		}
	}
	return nil
}

func loadModule(path string) error {
	name := strings.TrimSuffix(filepath.Base(path), ".ko")
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("boot: load module %s: %w", name, err)
	}
	defer f.Close()
	err = unix.FinitModule(int(f.Fd()), "", 0)
	switch {
	case err == nil, errors.Is(err, unix.EEXIST):
		return nil
	case errors.Is(err, unix.ENOENT):
		// finit_module reports an unresolved symbol as ENOENT, which reads
		// like a missing file; say what it means.
		return fmt.Errorf("boot: load module %s (%s): %w: unknown symbol, a dependency is missing from the order or comes after it", name, path, err)
	default:
		return fmt.Errorf("boot: load module %s (%s): %w", name, path, err)
	}
}
