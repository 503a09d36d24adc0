package tetherctl

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/modulebuild"
)

// moduleBuildCmd is `module build SRC NAME:VERSION`: build an erofs module
// from a folder, a tarball, an image layout or archive, or a registry
// image, then push it ("Building the module" in docs/operator-guide.md).
func (a *App) moduleBuildCmd() *cobra.Command {
	var (
		sig, keep, kind, maxSize string
		opts                     modulebuild.Options
		noPush                   bool
	)
	cmd := &cobra.Command{
		Use:   "build SRC NAME:VERSION",
		Short: "Build a compressed erofs module from a folder, a tarball, an image layout or archive, or an image reference, and push it",
		Long: `SRC is one of:
  a folder                      the root as it is on disk
  a tar file, or - for stdin    docker export, tar -c (gzip is detected)
  an OCI image layout folder    oci-layout, index.json, blobs/ (or the same in a tar)
  a docker save archive         (gzip is detected)
  an image reference            pulled from its registry, e.g. registry.example/team/app:1
Owners, modes, setuid bits, links, hard links, devices, FIFOs and xattrs are
kept. Staging a tarball or an image needs root (owners, devices, capabilities);
a folder does not. mkfs.erofs (erofs-utils) writes the image.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, _, err := splitRef(args[1]); err != nil {
				return err
			}
			if noPush && keep == "" {
				return errors.New("--no-push needs --keep PATH: the image would be thrown away")
			}
			n, err := parseSize(maxSize)
			if err != nil {
				return fmt.Errorf("--max-size: %w", err)
			}
			opts.MaxSize, opts.Kind = n, modulebuild.Kind(kind)
			opts.Source, opts.Stdin, opts.Clock = args[0], cmd.InOrStdin(), clock.Real{}
			opts.Out = keep
			if opts.Out == "" {
				f, err := os.CreateTemp("", "tether-module-*.erofs")
				if err != nil {
					return err
				}
				opts.Out = f.Name()
				f.Close()
				defer os.Remove(opts.Out)
			}
			prog := newStageProgress(a.Stderr, clock.Real{})
			opts.Progress = prog.report
			res, err := modulebuild.Build(a.base, opts)
			prog.done()
			if err != nil {
				return err
			}
			if noPush {
				return a.printBuild(res)
			}
			fmt.Fprintf(a.Stderr, "built %s: %s of files -> %s %s image %s in %s\n", args[1],
				humanBytes(res.TreeBytes), humanBytes(res.Size), res.Compress, res.Digest, res.Elapsed.Round(time.Millisecond))
			return a.pushModule(args[1], opts.Out, sig)
		},
	}
	f := cmd.Flags()
	f.StringVar(&sig, "signature", "", "file with the raw 64-byte Ed25519 signature over the module")
	f.StringArrayVar(&a.signWith, "sign-with", nil, "sign with this signer key (signer.key) before pushing; repeatable")
	f.StringVar(&keep, "keep", "", "also keep the built image at this path")
	f.BoolVar(&noPush, "no-push", false, "build only (with --keep); -o json prints the build")
	f.StringVar(&kind, "source", "", "what SRC is, when guessing is wrong: dir, tar, oci, oci-archive, docker-archive or image")
	f.StringVar(&opts.Platform, "platform", "linux/amd64", "os/arch[/variant] of the image to take from a multi-platform source")
	f.StringVar(&opts.Compress, "compress", "lz4hc", "erofs compression: lz4hc, lz4 or none")
	f.StringVar(&maxSize, "max-size", "8GiB", "refuse a tree with more file data than this (a module lives in the node's RAM)")
	f.BoolVar(&opts.Insecure, "insecure-registry", false, "pull the image over plain HTTP")
	f.StringVar(&opts.WorkDir, "work-dir", "", "where to stage a tarball or image (default: beside --keep, else the temp folder)")
	return cmd
}

func (a *App) printBuild(res *modulebuild.Result) error {
	if a.Output == "json" {
		b, err := json.Marshal(res)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(a.Stdout, string(b))
		return err
	}
	w := tabwriter.NewWriter(a.Stdout, 0, 4, 2, ' ', 0)
	row(w, "SOURCE", res.Source)
	row(w, "KIND", res.Kind)
	if res.ImageDigest != "" {
		row(w, "IMAGE", res.ImageDigest+"  "+res.Platform)
	}
	row(w, "FILES", humanBytes(res.TreeBytes))
	row(w, "SIZE", humanBytes(res.Size)+"  "+res.Compress)
	row(w, "DIGEST", res.Digest)
	row(w, "TOOK", res.Elapsed.Round(time.Millisecond))
	return w.Flush()
}

// parseSize reads 8GiB, 512MiB, 1G, 4096: binary and decimal suffixes.
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"B", 1}} {
		if v, ok := strings.CutSuffix(t, u.suffix); ok {
			t, mult = strings.TrimSpace(v), u.m
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("%q: want a positive size such as 8GiB, 512MiB or 1000000", s)
	}
	return n * mult, nil
}

// stageProgress shows a build's stages on stderr: one line rewritten in
// place on a terminal, else a line when the stage changes and every
// progressEvery, so CI logs show a long build is alive without a flood.
type stageProgress struct {
	w     io.Writer
	clk   clock.Clock
	tty   bool
	stage string
	last  time.Time
	start time.Time
	line  bool
}

const progressEvery = 5 * time.Second

func newStageProgress(w io.Writer, clk clock.Clock) *stageProgress {
	now := clk.Now()
	return &stageProgress{w: w, clk: clk, tty: isTerminal(w), start: now, last: now}
}

func (p *stageProgress) report(ev modulebuild.Progress) {
	now := p.clk.Now()
	changed := ev.Stage != p.stage
	p.stage = ev.Stage
	if !changed && now.Sub(p.last) < map[bool]time.Duration{true: 200 * time.Millisecond, false: progressEvery}[p.tty] {
		return
	}
	p.last = now
	msg := "build: " + ev.Stage
	if ev.Done > 0 {
		msg += "  " + humanBytes(ev.Done)
	}
	msg += fmt.Sprintf("  %s", now.Sub(p.start).Round(time.Second))
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s", msg)
		p.line = true
		return
	}
	fmt.Fprintln(p.w, msg)
}

func (p *stageProgress) done() {
	if p.line {
		fmt.Fprintln(p.w)
		p.line = false
	}
}

// isTerminal reports whether w is a character device such as a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
