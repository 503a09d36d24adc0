// Package tftp serves the iPXE loaders that PXE firmware fetches, and
// nothing else: exactly the loader files by name, read-only. Every other
// name (paths, "..", absolute names, listings) and every write is refused.
//
// The server is Tether's own (docs/adr/0015): a read request, its options
// (RFC 2347 blksize and tsize) and the transfer are parsed and bounded
// here, so a datagram from anyone on the provisioning network meets code
// that checks every length before it reads, and a transfer that goes
// wrong ends alone (server.go).
package tftp

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// DefaultDir is where Debian's ipxe package installs the loaders.
const DefaultDir = "/usr/lib/ipxe"

// LoaderNames are the only files served: BIOS (undionly.kpxe) and UEFI
// (ipxe.efi, snponly.efi) builds of iPXE.
var LoaderNames = []string{"undionly.kpxe", "ipxe.efi", "snponly.efi"}

// Loaders is the directory of iPXE loaders.
type Loaders struct{ Dir string }

// ErrNotALoader is the refusal of any name but a loader's.
var ErrNotALoader = errors.New("not a loader file")

// Open opens a loader by its exact name.
func (l Loaders) Open(name string) (*os.File, error) {
	ok := false
	for _, n := range LoaderNames {
		ok = ok || name == n
	}
	if !ok {
		return nil, fmt.Errorf("%q: %w", clip(name), ErrNotALoader)
	}
	// name is one of the fixed names above: no separator, no "..".
	f, err := os.Open(filepath.Join(l.Dir, name))
	if err != nil {
		return nil, fmt.Errorf("loader %s: %w", name, err)
	}
	return f, nil
}

// Check reports a loader directory that holds none of the loaders: a
// missing ipxe package is a configuration error, not a silent PXE failure.
func (l Loaders) Check() error {
	for _, n := range LoaderNames {
		if st, err := os.Stat(filepath.Join(l.Dir, n)); err == nil && st.Mode().IsRegular() {
			return nil
		}
	}
	return fmt.Errorf("--ipxe-dir %s holds none of %v (install Debian's ipxe package)", l.Dir, LoaderNames)
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
