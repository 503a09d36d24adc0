// Package tftp serves the iPXE loaders that PXE firmware fetches, and
// nothing else: exactly the loader files by name, read-only. Every other
// name (paths, "..", absolute names, listings) and every write is refused.
package tftp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"pack.ag/tftp"
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

// Server is a read-only TFTP server of the loaders.
type Server struct {
	Loaders Loaders
	Log     *slog.Logger
}

// ServeTFTP implements tftp.ReadHandler.
func (s *Server) ServeTFTP(r tftp.ReadRequest) {
	f, err := s.Loaders.Open(r.Name())
	if err != nil {
		s.Log.Debug("tftp: refused", "remote", r.Addr().String(), "name", clip(r.Name()), "err", err)
		r.WriteError(tftp.ErrCodeFileNotFound, "not found")
		return
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil {
		r.WriteSize(st.Size())
	}
	if _, err := io.Copy(r, f); err != nil {
		s.Log.Debug("tftp: transfer", "remote", r.Addr().String(), "name", r.Name(), "err", err)
		return
	}
	s.Log.Info("tftp: loader sent", "remote", r.Addr().String(), "name", r.Name())
}

// ReceiveTFTP implements tftp.WriteHandler: writes are refused outright.
func (s *Server) ReceiveTFTP(w tftp.WriteRequest) {
	s.Log.Debug("tftp: write refused", "remote", w.Addr().String(), "name", clip(w.Name()))
	w.WriteError(tftp.ErrCodeAccessViolation, "read-only server")
}

// Serve serves on conn until ctx ends.
func (s *Server) Serve(ctx context.Context, conn *net.UDPConn) error {
	// One port for every transfer: a per-transfer socket would be opened
	// later, by another goroutine, unbound to the interface tetherd was
	// told to serve on.
	srv, err := tftp.NewServer(conn.LocalAddr().String(), tftp.ServerSinglePort(true))
	if err != nil {
		return fmt.Errorf("tftp: %w", err)
	}
	srv.ReadHandler(s)
	srv.WriteHandler(s)
	stop := context.AfterFunc(ctx, func() { srv.Close() })
	defer stop()
	err = srv.Serve(conn)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
