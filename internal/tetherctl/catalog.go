package tetherctl

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	erofs "github.com/erofs/go-erofs"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/structpb"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

func parseRefs(list []string) ([]*v1.ModuleRef, error) {
	var out []*v1.ModuleRef
	for _, item := range list {
		for _, s := range strings.Split(item, ",") {
			if s = strings.TrimSpace(s); s == "" {
				continue
			}
			n, v, err := splitRef(s)
			if err != nil {
				return nil, err
			}
			out = append(out, &v1.ModuleRef{Name: n, Version: v})
		}
	}
	return out, nil
}

func refsText(rs []*v1.ModuleRef) string {
	var parts []string
	for _, r := range rs {
		parts = append(parts, r.Name+":"+r.Version)
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ",")
}

func (a *App) templateTable(ts ...*v1.Template) func(*tabwriter.Writer) {
	return func(w *tabwriter.Writer) {
		row(w, "NAME", "ROOT", "EXTENSIONS", "KERNEL ARGS", "CREATED")
		for _, t := range ts {
			row(w, t.Name, refsText(t.RootModules), refsText(t.ExtensionModules), dash(t.KernelArgs), when(t.CreatedAt))
		}
	}
}

func (a *App) templateCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "template", Short: "Manage templates (what nodes boot)"}
	var root, ext []string
	var req v1.CreateTemplateRequest
	create := &cobra.Command{
		Use: "create NAME --root MOD:VER[,MOD:VER...] [--ext MOD:VER...]", Short: "Create a template", Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			c, err := a.dial()
			if err != nil {
				return err
			}
			req.Name = args[0]
			if req.RootModules, err = parseRefs(root); err != nil {
				return fmt.Errorf("--root %w", err)
			}
			if req.ExtensionModules, err = parseRefs(ext); err != nil {
				return fmt.Errorf("--ext %w", err)
			}
			ctx, cancel := a.ctx()
			defer cancel()
			t, err := c.CreateTemplate(ctx, &req)
			if err != nil {
				return err
			}
			return a.print(t, a.templateTable(t))
		},
	}
	create.Flags().StringSliceVar(&root, "root", nil, "root layers, bottom first (NAME:VERSION, comma-separated or repeated)")
	create.Flags().StringSliceVar(&ext, "ext", nil, "extension modules (NAME:VERSION)")
	create.Flags().StringVar(&req.KernelArgs, "kernel-args", "", "extra kernel command line arguments")
	create.Flags().BoolVar(&req.RequireSignedModules, "require-signed", false, "agents refuse unsigned modules")
	create.Flags().StringArrayVar(&req.RequiredSigners, "require-signer", nil, "signer fingerprint (sha256:HEX) one of which must have signed every module (repeatable)")
	create.Flags().StringVar(&req.KernelDigest, "kernel", "", "kernel artifact digest (default: the control plane's)")
	create.Flags().StringVar(&req.InitramfsDigest, "initramfs", "", "initramfs artifact digest (default: the control plane's)")
	_ = create.MarkFlagRequired("root")

	var uroot, uext []string
	var ureq v1.UpdateTemplateRequest
	update := &cobra.Command{
		Use: "update NAME [--root ...] [--ext ...] [--kernel-args ...]", Short: "Change a template", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.dial()
			if err != nil {
				return err
			}
			ureq.Name = args[0]
			f := cmd.Flags()
			if f.Changed("root") {
				ureq.UpdateMask = append(ureq.UpdateMask, "root_modules")
				if ureq.RootModules, err = parseRefs(uroot); err != nil {
					return fmt.Errorf("--root %w", err)
				}
			}
			if f.Changed("ext") {
				ureq.UpdateMask = append(ureq.UpdateMask, "extension_modules")
				if ureq.ExtensionModules, err = parseRefs(uext); err != nil {
					return fmt.Errorf("--ext %w", err)
				}
			}
			for flag, field := range map[string]string{"kernel-args": "kernel_args", "require-signed": "require_signed_modules", "kernel": "kernel_digest", "initramfs": "initramfs_digest", "require-signer": "required_signers"} {
				if f.Changed(flag) {
					ureq.UpdateMask = append(ureq.UpdateMask, field)
				}
			}
			ctx, cancel := a.ctx()
			defer cancel()
			t, err := c.UpdateTemplate(ctx, &ureq)
			if err != nil {
				return err
			}
			return a.print(t, a.templateTable(t))
		},
	}
	update.Flags().StringSliceVar(&uroot, "root", nil, "root layers, bottom first")
	update.Flags().StringSliceVar(&uext, "ext", nil, "extension modules")
	update.Flags().StringVar(&ureq.KernelArgs, "kernel-args", "", "extra kernel command line arguments")
	update.Flags().BoolVar(&ureq.RequireSignedModules, "require-signed", false, "agents refuse unsigned modules")
	update.Flags().StringArrayVar(&ureq.RequiredSigners, "require-signer", nil, "signer fingerprint (sha256:HEX), repeatable; replaces the list (pass --require-signer= to clear)")
	update.Flags().StringVar(&ureq.KernelDigest, "kernel", "", "kernel artifact digest")
	update.Flags().StringVar(&ureq.InitramfsDigest, "initramfs", "", "initramfs artifact digest")

	list := &cobra.Command{Use: "list", Short: "List templates", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error {
		c, err := a.dial()
		if err != nil {
			return err
		}
		ctx, cancel := a.ctx()
		defer cancel()
		resp, err := c.ListTemplates(ctx, &v1.ListTemplatesRequest{PageSize: 1000})
		if err != nil {
			return err
		}
		return a.print(resp, a.templateTable(resp.Templates...))
	}}
	get := &cobra.Command{Use: "get NAME", Short: "Show a template", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		c, err := a.dial()
		if err != nil {
			return err
		}
		ctx, cancel := a.ctx()
		defer cancel()
		t, err := c.GetTemplate(ctx, &v1.GetTemplateRequest{Name: args[0]})
		if err != nil {
			return err
		}
		return a.print(t, func(w *tabwriter.Writer) {
			row(w, "name:", t.Name)
			row(w, "id:", t.Id)
			for i, m := range t.RootModules {
				row(w, fmt.Sprintf("root[%d]:", i), m.Name+":"+m.Version, m.Digest)
			}
			for i, m := range t.ExtensionModules {
				row(w, fmt.Sprintf("ext[%d]:", i), m.Name+":"+m.Version, m.Digest)
			}
			row(w, "kernel args:", dash(t.KernelArgs))
			row(w, "signed modules:", t.RequireSignedModules)
			row(w, "required signers:", dash(strings.Join(t.RequiredSigners, ",")))
		})
	}}
	del := &cobra.Command{Use: "delete NAME", Short: "Delete a template no node or pool uses", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		c, err := a.dial()
		if err != nil {
			return err
		}
		ctx, cancel := a.ctx()
		defer cancel()
		resp, err := c.DeleteTemplate(ctx, &v1.DeleteTemplateRequest{Name: args[0]})
		if err != nil {
			return err
		}
		return a.print(resp, func(w *tabwriter.Writer) { row(w, "deleted template", args[0]) })
	}}
	cmd.AddCommand(create, update, list, get, del)
	return cmd
}

func (a *App) moduleTable(ms ...*v1.Module) func(*tabwriter.Writer) {
	return func(w *tabwriter.Writer) {
		row(w, "NAME", "VERSION", "DIGEST", "SIZE", "SIGNED", "CREATED")
		for _, m := range ms {
			row(w, m.Name, m.Version, m.Digest, humanBytes(m.Size), signedColumn(m), when(m.CreatedAt))
		}
	}
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
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
	var bsig string
	var keep string
	build := &cobra.Command{
		Use: "build DIR NAME:VERSION", Short: "Build an uncompressed erofs image from a folder and push it", Args: cobra.ExactArgs(2),
		RunE: func(_ *cobra.Command, args []string) error {
			out := keep
			if out == "" {
				f, err := os.CreateTemp("", "tether-module-*.erofs")
				if err != nil {
					return err
				}
				out = f.Name()
				f.Close()
				defer os.Remove(out)
			}
			if err := BuildErofs(args[0], out); err != nil {
				return err
			}
			return a.pushModule(args[1], out, bsig)
		},
	}
	build.Flags().StringVar(&bsig, "signature", "", "file with the raw 64-byte Ed25519 signature over the module")
	build.Flags().StringArrayVar(&a.signWith, "sign-with", nil, "sign with this signer key (signer.key) before pushing; repeatable")
	build.Flags().StringVar(&keep, "keep", "", "also keep the built image at this path")
	var name string
	list := &cobra.Command{Use: "list", Short: "List modules", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error {
		c, err := a.dial()
		if err != nil {
			return err
		}
		ctx, cancel := a.ctx()
		defer cancel()
		resp, err := c.ListModules(ctx, &v1.ListModulesRequest{Name: name, PageSize: 1000})
		if err != nil {
			return err
		}
		return a.print(resp, a.moduleTable(resp.Modules...))
	}}
	list.Flags().StringVar(&name, "name", "", "only versions of this module")
	get := &cobra.Command{Use: "get NAME:VERSION", Short: "Show a module", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		n, v, err := splitRef(args[0])
		if err != nil {
			return err
		}
		c, err := a.dial()
		if err != nil {
			return err
		}
		ctx, cancel := a.ctx()
		defer cancel()
		m, err := c.GetModule(ctx, &v1.GetModuleRequest{Name: n, Version: v})
		if err != nil {
			return err
		}
		return a.print(m, a.moduleDetail(m))
	}}
	del := &cobra.Command{Use: "delete NAME:VERSION", Short: "Delete a module no template references", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		n, v, err := splitRef(args[0])
		if err != nil {
			return err
		}
		c, err := a.dial()
		if err != nil {
			return err
		}
		ctx, cancel := a.ctx()
		defer cancel()
		resp, err := c.DeleteModule(ctx, &v1.DeleteModuleRequest{Name: n, Version: v})
		if err != nil {
			return err
		}
		return a.print(resp, func(w *tabwriter.Writer) { row(w, "deleted module", args[0]) })
	}}
	cmd.AddCommand(push, build, list, get, del, a.moduleSignCmd())
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
	c, err := a.dial()
	if err != nil {
		return err
	}
	stream, err := c.PushModule(contextBackground())
	if err != nil {
		return err
	}
	if err := stream.Send(&v1.PushModuleRequest{Msg: &v1.PushModuleRequest_Header{Header: &v1.PushModuleHeader{
		Name: n, Version: v, Digest: digest, Size: st.Size(), Signature: sig, Signatures: sigs}}}); err != nil {
		return a.streamErr(stream.CloseAndRecv())
	}
	prog := newProgress(a.Stderr, "push "+ref, st.Size(), a.Output == "table")
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
	return a.print(m, a.moduleTable(m))
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
	on       bool
}

func newProgress(w io.Writer, label string, total int64, on bool) *progress {
	return &progress{w: w, label: label, total: total, start: time.Now(), on: on}
}

func (p *progress) add(n int64) {
	p.n += n
	if !p.on || time.Since(p.last) < 200*time.Millisecond {
		return
	}
	p.last = time.Now()
	p.print("\r")
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
		p.print("\r")
		fmt.Fprintln(p.w)
	}
}

// BuildErofs writes an uncompressed erofs image of dir to out with a fixed
// build time, so the same folder gives the same digest. go-erofs follows
// symlinks and stores them as regular files.
func BuildErofs(dir, out string) error {
	st, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("module build: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("module build: %s is not a folder", dir)
	}
	f, err := os.Create(out)
	if err != nil {
		return fmt.Errorf("module build: %w", err)
	}
	w := erofs.Create(f, erofs.WithBuildTime(0, 0), erofs.WithTempDir(filepath.Dir(out)))
	if err := w.CopyFrom(os.DirFS(dir)); err != nil {
		f.Close()
		return fmt.Errorf("module build: copy %s: %w", dir, err)
	}
	if err := w.Close(); err != nil {
		f.Close()
		return fmt.Errorf("module build: %w", err)
	}
	return f.Close()
}

func (a *App) nodeTable(ns ...*v1.Node) func(*tabwriter.Writer) {
	return func(w *tabwriter.Writer) {
		row(w, "NAME", "TEMPLATE", "ENABLED", "PUBLIC ADDRESS", "CREATED")
		for _, n := range ns {
			row(w, n.Name, n.TemplateName, n.Enabled, dash(n.PublicAddress), when(n.CreatedAt))
		}
	}
}

func parseConfig(s string) (*structpb.Struct, error) {
	if s == "" {
		return nil, nil
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return nil, fmt.Errorf("--config-json: want a JSON object: %w", err)
	}
	return structpb.NewStruct(m)
}

func (a *App) nodeCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "Manage nodes (logical hosts)"}
	var req v1.CreateNodeRequest
	var cfgJSON string
	var disabled bool
	create := &cobra.Command{Use: "create NAME --template TEMPLATE", Short: "Create a node", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		c, err := a.dial()
		if err != nil {
			return err
		}
		req.Name = args[0]
		if req.Config, err = parseConfig(cfgJSON); err != nil {
			return err
		}
		enabled := !disabled
		req.Enabled = &enabled
		ctx, cancel := a.ctx()
		defer cancel()
		n, err := c.CreateNode(ctx, &req)
		if err != nil {
			return err
		}
		return a.print(n, a.nodeTable(n))
	}}
	create.Flags().StringVar(&req.Template, "template", "", "template the node boots (required)")
	create.Flags().StringVar(&cfgJSON, "config-json", "", "free-form JSON object")
	create.Flags().StringVar(&req.PublicAddress, "public-address", "", "public address")
	create.Flags().BoolVar(&disabled, "disabled", false, "create the node disabled")
	_ = create.MarkFlagRequired("template")

	var ureq v1.UpdateNodeRequest
	var ucfg string
	update := &cobra.Command{Use: "update NAME [--template T] [--enabled=BOOL] [--config-json J] [--public-address A]", Short: "Change a node", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.dial()
			if err != nil {
				return err
			}
			ureq.Name = args[0]
			for flag, field := range map[string]string{"template": "template", "enabled": "enabled", "config-json": "config", "public-address": "public_address"} {
				if cmd.Flags().Changed(flag) {
					ureq.UpdateMask = append(ureq.UpdateMask, field)
				}
			}
			if ureq.Config, err = parseConfig(ucfg); err != nil {
				return err
			}
			ctx, cancel := a.ctx()
			defer cancel()
			n, err := c.UpdateNode(ctx, &ureq)
			if err != nil {
				return err
			}
			return a.print(n, a.nodeTable(n))
		}}
	update.Flags().StringVar(&ureq.Template, "template", "", "template")
	update.Flags().BoolVar(&ureq.Enabled, "enabled", true, "enable or disable provisioning")
	update.Flags().StringVar(&ucfg, "config-json", "", "free-form JSON object")
	update.Flags().StringVar(&ureq.PublicAddress, "public-address", "", "public address")

	var tpl string
	list := &cobra.Command{Use: "list", Short: "List nodes", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error {
		c, err := a.dial()
		if err != nil {
			return err
		}
		ctx, cancel := a.ctx()
		defer cancel()
		resp, err := c.ListNodes(ctx, &v1.ListNodesRequest{Template: tpl, PageSize: 1000})
		if err != nil {
			return err
		}
		return a.print(resp, a.nodeTable(resp.Nodes...))
	}}
	list.Flags().StringVar(&tpl, "template", "", "only nodes of this template")
	get := &cobra.Command{Use: "get NAME", Short: "Show a node", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		c, err := a.dial()
		if err != nil {
			return err
		}
		ctx, cancel := a.ctx()
		defer cancel()
		n, err := c.GetNode(ctx, &v1.GetNodeRequest{Name: args[0]})
		if err != nil {
			return err
		}
		return a.print(n, a.nodeTable(n))
	}}
	del := &cobra.Command{Use: "delete NAME", Short: "Delete a node with no live instance", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		c, err := a.dial()
		if err != nil {
			return err
		}
		ctx, cancel := a.ctx()
		defer cancel()
		resp, err := c.DeleteNode(ctx, &v1.DeleteNodeRequest{Name: args[0]})
		if err != nil {
			return err
		}
		return a.print(resp, func(w *tabwriter.Writer) { row(w, "deleted node", args[0]) })
	}}
	cmd.AddCommand(create, update, list, get, del)
	return cmd
}
