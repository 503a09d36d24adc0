package tetherctl

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

func moduleTable(w *tabwriter.Writer, ms []*v1.Module) {
	row(w, "NAME", "VERSION", "DIGEST", "SIZE", "SIGNED", "CREATED")
	for _, m := range ms {
		row(w, m.Name, m.Version, m.Digest, humanBytes(m.Size), signedColumn(m), when(m.CreatedAt))
	}
}

func (a *App) moduleCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "module", Short: "Manage erofs modules"}
	var sigFile string
	push := &cobra.Command{
		Use: "push NAME:VERSION FILE", Short: "Upload an erofs image", Args: cobra.ExactArgs(2),
		RunE: func(_ *cobra.Command, args []string) error {
			return a.pushModule(args[0], args[1], sigFile)
		},
	}
	push.Flags().StringVar(&sigFile, "signature", "", "file with the raw 64-byte Ed25519 signature over the module")
	push.Flags().StringArrayVar(&a.signWith, "sign-with", nil, "sign with this signer key (signer.key) before pushing; repeatable")
	var name string
	var pg paging
	listCmd := &cobra.Command{Use: "list", Short: "List modules", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error {
		return list(a, v1.AdminServiceClient.ListModules, &v1.ListModulesRequest{Name: name}, pg,
			func(w *tabwriter.Writer, r *v1.ListModulesResponse) { moduleTable(w, r.Modules) })
	}}
	listCmd.Flags().StringVar(&name, "name", "", "only versions of this module")
	pg.flags(listCmd.Flags(), 0, "modules")
	get := &cobra.Command{Use: "get NAME:VERSION", Short: "Show a module", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		n, v, err := splitRef(args[0])
		if err != nil {
			return err
		}
		return call(a, v1.AdminServiceClient.GetModule, &v1.GetModuleRequest{Name: n, Version: v},
			func(w *tabwriter.Writer, m *v1.Module) { a.moduleDetail(m)(w) })
	}}
	del := &cobra.Command{Use: "delete NAME:VERSION", Short: "Delete a module no template references", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		n, v, err := splitRef(args[0])
		if err != nil {
			return err
		}
		return call(a, v1.AdminServiceClient.DeleteModule, &v1.DeleteModuleRequest{Name: n, Version: v}, deleted[*v1.DeleteModuleResponse]("module", args[0]))
	}}
	cmd.AddCommand(push, a.moduleBuildCmd(), listCmd, get, del, a.moduleSignCmd())
	return cmd
}

// pushModule hashes the file first (so the server can refuse a corrupted
// transfer), then streams it with a progress line on stderr.
func (a *App) pushModule(ref, path, sigFile string) error {
	n, v, err := splitRef(ref)
	if err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("hash %s: %w", path, err)
	}
	digest := "sha256:" + hex.EncodeToString(h.Sum(nil))
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	var sig []byte
	if sigFile != "" {
		if sig, err = os.ReadFile(sigFile); err != nil {
			return fmt.Errorf("--signature: %w", err)
		}
	}
	sigs, err := moduleSignatures("--sign-with", a.signWith, n, v, digest)
	if err != nil {
		return err
	}
	// The same bytes already there under this name need no upload (make run
	// pushes its modules on every start, the Debian root is 114 MiB); other
	// bytes under it are refused before the first byte is sent, not after a
	// progress line. A push that brings signatures still goes through, to add
	// them. Any other answer (not found, not allowed to read) leaves the
	// decision to the push itself.
	existing, err := invoke(a, v1.AdminServiceClient.GetModule, &v1.GetModuleRequest{Name: n, Version: v})
	if err == nil {
		if existing.Digest != digest {
			return status.Errorf(codes.AlreadyExists, "module %s already exists with digest %s, and %s is %s; modules are immutable, push a new version", ref, existing.Digest, path, digest)
		}
		if sig == nil && len(sigs) == 0 {
			fmt.Fprintf(a.Stderr, "module %s is already there with this digest; nothing to upload\n", ref)
			return a.print(existing, a.moduleDetail(existing))
		}
	}
	c, err := a.dial()
	if err != nil {
		return err
	}
	// A stream has no --timeout deadline (a big module takes long); an
	// interrupt still ends it.
	stream, err := c.PushModule(a.base)
	if err != nil {
		return err
	}
	if err := stream.Send(&v1.PushModuleRequest{Msg: &v1.PushModuleRequest_Header{Header: &v1.PushModuleHeader{
		Name: n, Version: v, Digest: digest, Size: st.Size(), Signature: sig, Signatures: sigs}}}); err != nil {
		return a.streamErr(stream.CloseAndRecv())
	}
	prog := newProgress(a.Stderr, "push "+ref, st.Size(), true)
	buf := make([]byte, 1<<20)
	for {
		k, rerr := f.Read(buf)
		if k > 0 {
			if err := stream.Send(&v1.PushModuleRequest{Msg: &v1.PushModuleRequest_Chunk{Chunk: buf[:k]}}); err != nil {
				prog.done()
				return a.streamErr(stream.CloseAndRecv())
			}
			prog.add(int64(k))
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			prog.done()
			return fmt.Errorf("read %s: %w", path, rerr)
		}
	}
	prog.done()
	m, err := stream.CloseAndRecv()
	if err != nil {
		return err
	}
	return a.print(m, a.moduleDetail(m))
}

func (a *App) streamErr(_ any, err error) error {
	if err == nil {
		return errors.New("the server closed the upload early")
	}
	return err
}

// progress prints "push base:1  42.0 MiB / 65.0 MiB  64%  38.2 MiB/s" to stderr.
type progress struct {
	w        io.Writer
	label    string
	total, n int64
	start    time.Time
	last     time.Time
	on, tty  bool
}

func newProgress(w io.Writer, label string, total int64, on bool) *progress {
	now := time.Now()
	return &progress{w: w, label: label, total: total, start: now, last: now, on: on, tty: isTerminal(w)}
}

// add shows the count: rewritten in place on a terminal, else as a line
// every progressEvery so that a log shows a long push is alive.
func (p *progress) add(n int64) {
	p.n += n
	every, prefix := 200*time.Millisecond, "\r"
	if !p.tty {
		every, prefix = progressEvery, ""
	}
	if !p.on || time.Since(p.last) < every {
		return
	}
	p.last = time.Now()
	p.print(prefix)
	if !p.tty {
		fmt.Fprintln(p.w)
	}
}

func (p *progress) print(prefix string) {
	secs := time.Since(p.start).Seconds()
	rate := 0.0
	if secs > 0 {
		rate = float64(p.n) / secs
	}
	pct := 100.0
	if p.total > 0 {
		pct = float64(p.n) * 100 / float64(p.total)
	}
	fmt.Fprintf(p.w, "%s%s  %s / %s  %3.0f%%  %s/s   ", prefix, p.label, humanBytes(p.n), humanBytes(p.total), pct, humanBytes(int64(rate)))
}

func (p *progress) done() {
	if p.on {
		p.print(map[bool]string{true: "\r"}[p.tty])
		fmt.Fprintln(p.w)
	}
}
