// Package modulebuild turns what operators already have — a folder, a tar
// stream, an OCI image layout, a docker save archive or an image in a
// registry — into a compressed erofs module. Image layers are applied in
// order to a staging folder (whiteouts and opaque folders honoured), and
// mkfs.erofs from erofs-utils writes the image with a fixed timestamp and
// UUID so that the same input gives the same digest (docs/adr/0021).
package modulebuild

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/tetherfleet/tether/internal/clock"
)

// DefaultMaxSize bounds the unpacked tree: a module lives in the node's
// RAM, and an image of more than this is far more likely a mistake (or a
// hostile archive) than a root.
const DefaultMaxSize int64 = 8 << 30

// Compressions are the -z choices; "none" writes an uncompressed image.
var Compressions = []string{"lz4hc", "lz4", "none"}

// fixedUUID is every image's filesystem UUID: a random one would make the
// same tree give a different digest on every build.
const fixedUUID = "7e7be4f1-0000-4000-8000-000000000000"

// Options says what to build and how.
type Options struct {
	Source   string    // a path, "-" for Stdin, or an image reference
	Kind     Kind      // KindAuto detects it
	Stdin    io.Reader // read when Source is "-"
	Out      string    // where the image is written
	WorkDir  string    // staging goes under here; default: Out's folder
	Platform string    // os/arch[/variant] of the image to take; default linux/amd64
	Compress string    // one of Compressions; default lz4hc
	MaxSize  int64     // bytes of file data the tree may hold; default DefaultMaxSize
	Insecure bool      // plain-HTTP registry
	Mkfs     string    // mkfs.erofs to run; default found on PATH
	Clock    clock.Clock
	// Progress, when set, hears each stage and the bytes done so far.
	Progress func(Progress)
}

// Progress is one report of a long build.
type Progress struct {
	Stage string // "spool", "layer 2/5", "stage", "mkfs"
	Done  int64  // bytes so far in this stage
	Total int64  // 0 when unknown
}

// Result describes a finished build.
type Result struct {
	Kind        Kind          `json:"kind"`
	Source      string        `json:"source"`
	ImageDigest string        `json:"image_digest,omitempty"` // the OCI manifest digest, for image sources
	Platform    string        `json:"platform,omitempty"`
	Layers      int           `json:"layers,omitempty"`
	TreeBytes   int64         `json:"tree_bytes"`
	Compress    string        `json:"compress"`
	Size        int64         `json:"size"`   // bytes of the erofs image
	Digest      string        `json:"digest"` // sha256 of the erofs image
	Elapsed     time.Duration `json:"elapsed_ns"`
}

// Build writes the module image to opts.Out. Nothing is left behind on
// failure but what the caller asked for; no partial image survives.
func Build(ctx context.Context, opts Options) (*Result, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	start := o.Clock.Now()
	res, err := build(ctx, o)
	if err != nil {
		os.Remove(o.Out)
		return nil, fmt.Errorf("module build: %w", err)
	}
	res.Elapsed = o.Clock.Now().Sub(start)
	return res, nil
}

func (o Options) withDefaults() (Options, error) {
	if o.Source == "" {
		return o, errors.New("module build: no source given")
	}
	if o.Out == "" {
		return o, errors.New("module build: no output path given")
	}
	if o.WorkDir == "" {
		o.WorkDir = filepath.Dir(o.Out)
	}
	if o.Platform == "" {
		o.Platform = "linux/amd64"
	}
	if o.Compress == "" {
		o.Compress = "lz4hc"
	}
	if !contains(Compressions, o.Compress) {
		return o, fmt.Errorf("module build: --compress %q: want one of %s", o.Compress, strings.Join(Compressions, ", "))
	}
	if o.MaxSize == 0 {
		o.MaxSize = DefaultMaxSize
	}
	if o.MaxSize < 0 {
		return o, fmt.Errorf("module build: --max-size %d: must be positive", o.MaxSize)
	}
	if o.Kind != KindAuto && !contains(Kinds, o.Kind) {
		return o, fmt.Errorf("module build: --source %q: want one of %v", o.Kind, Kinds)
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Progress == nil {
		o.Progress = func(Progress) {}
	}
	if o.Mkfs == "" {
		p, err := exec.LookPath("mkfs.erofs")
		if err != nil {
			return o, errors.New("module build: mkfs.erofs not found on PATH: install erofs-utils (Debian/Ubuntu: apt-get install erofs-utils; Fedora: dnf install erofs-utils)")
		}
		o.Mkfs = p
	}
	return o, nil
}

func contains[T comparable](list []T, v T) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

func build(ctx context.Context, o Options) (*Result, error) {
	src := o.Source
	if src == "-" {
		f, err := spool(o)
		if err != nil {
			return nil, err
		}
		defer os.Remove(f)
		src = f
	}
	kind := o.Kind
	if kind == KindAuto {
		var err error
		if kind, err = detect(src); err != nil {
			if src != o.Source {
				return nil, fmt.Errorf("standard input: %w", err)
			}
			if _, serr := os.Stat(src); serr == nil {
				return nil, fmt.Errorf("source %s: %w", src, err)
			}
			return nil, err
		}
	}
	res := &Result{Kind: kind, Source: o.Source, Compress: o.Compress}
	label := o.Source
	if label == "-" {
		label = "standard input"
	}
	if kind == KindDir {
		n, err := treeBytes(src, o.MaxSize)
		if err != nil {
			return nil, err
		}
		res.TreeBytes = n
		return res, mkfs(ctx, o, src, res)
	}
	stageDir, err := os.MkdirTemp(o.WorkDir, "tether-stage-*")
	if err != nil {
		return nil, fmt.Errorf("staging folder: %w", err)
	}
	defer os.RemoveAll(stageDir)
	root := filepath.Join(stageDir, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		return nil, err
	}
	if kind == KindOCIArchive {
		// Unpacked with the same care as a root: the archive is as
		// untrusted as any tarball.
		dir := filepath.Join(stageDir, "layout")
		if err := os.Mkdir(dir, 0o700); err != nil {
			return nil, err
		}
		if err := applyTarFile(src, &stager{ctx: ctx, root: dir, maxBytes: o.MaxSize}, label); err != nil {
			return nil, err
		}
		kind, src = KindOCILayout, dir
	}
	st := &stager{ctx: ctx, root: root, maxBytes: o.MaxSize, progress: func(n int64) { o.Progress(Progress{Stage: "stage", Done: n}) }}
	if kind == KindTar {
		if err := applyTarFile(src, st, label); err != nil {
			return nil, err
		}
	} else if err := applyImage(ctx, o, kind, src, st, res); err != nil {
		return nil, err
	}
	res.TreeBytes = st.bytes
	return res, mkfs(ctx, o, root, res)
}

// applyTarFile unpacks a tar file, gzip'd or not, with no whiteouts.
func applyTarFile(src string, st *stager, label string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	r, err := maybeGunzip(f)
	if err != nil {
		return fmt.Errorf("tarball %s: %w", label, err)
	}
	if err := st.apply(r, false); err != nil {
		return fmt.Errorf("tarball %s: %w", label, err)
	}
	return nil
}

// spool copies stdin to a file so its kind can be told and an image
// archive read more than once.
func spool(o Options) (string, error) {
	if o.Stdin == nil {
		return "", errors.New("source - : no standard input")
	}
	f, err := os.CreateTemp(o.WorkDir, "tether-stdin-*")
	if err != nil {
		return "", fmt.Errorf("spool stdin: %w", err)
	}
	// The archive on stdin may be compressed; bound it by the same limit
	// as the tree so that an endless stream stops.
	n, err := io.Copy(f, io.LimitReader(o.Stdin, o.MaxSize+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	o.Progress(Progress{Stage: "spool", Done: n})
	if err == nil && n > o.MaxSize {
		err = &TooLargeError{Limit: o.MaxSize, What: "standard input"}
	}
	if err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("spool stdin: %w", err)
	}
	return f.Name(), nil
}

func applyImage(ctx context.Context, o Options, kind Kind, src string, st *stager, res *Result) error {
	plat, err := v1.ParsePlatform(o.Platform)
	if err != nil {
		return fmt.Errorf("--platform %q: %w", o.Platform, err)
	}
	img, err := openImage(ctx, kind, src, *plat, o.Insecure)
	if err != nil {
		return err
	}
	what := string(kind) + " " + o.Source
	if d, err := img.Digest(); err == nil {
		res.ImageDigest = d.String()
	}
	res.Platform = plat.String()
	layers, err := img.Layers()
	if err != nil {
		return fmt.Errorf("%s: layers: %w", what, err)
	}
	res.Layers = len(layers)
	// The diff IDs come from the config, not from the layers: a layer
	// read from disk computes its own from whatever bytes it holds.
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("%s: config: %w", what, err)
	}
	if len(cf.RootFS.DiffIDs) != len(layers) {
		return fmt.Errorf("%s: config lists %d diff ids for %d layers", what, len(cf.RootFS.DiffIDs), len(layers))
	}
	// The compressed sizes in the manifest refuse an oversized image
	// before anything is fetched; the unpacked bytes are counted as they
	// are written.
	var total int64
	for _, l := range layers {
		n, err := l.Size()
		if err != nil {
			return fmt.Errorf("%s: layer size: %w", what, err)
		}
		total += n
	}
	if total > o.MaxSize {
		return &TooLargeError{Limit: o.MaxSize, What: fmt.Sprintf("%s (%d bytes of layers)", what, total)}
	}
	for i, l := range layers {
		if err := applyLayer(o, st, l, cf.RootFS.DiffIDs[i], fmt.Sprintf("layer %d/%d", i+1, len(layers))); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	return nil
}

// applyLayer unpacks one layer and checks the uncompressed stream against
// the config's diff ID: a layout or archive on disk is not verified by the
// library, and a corrupt blob must fail the build, not become a root.
func applyLayer(o Options, st *stager, l v1.Layer, diffID v1.Hash, label string) error {
	label = fmt.Sprintf("%s (%s)", label, diffID)
	rc, err := l.Uncompressed()
	if err != nil {
		return fmt.Errorf("%s: open: %w", label, err)
	}
	defer rc.Close()
	h := sha256.New()
	r := &readErr{r: io.TeeReader(rc, h)}
	o.Progress(Progress{Stage: label})
	if err := st.apply(r, true); err != nil {
		if r.err != nil {
			return fmt.Errorf("%s: corrupt or truncated layer: %w", label, r.err)
		}
		return fmt.Errorf("%s: %w", label, err)
	}
	// The tar end marker may leave padding unread; hash it too.
	if _, err := io.Copy(io.Discard, r); err != nil {
		return fmt.Errorf("%s: corrupt or truncated layer: %w", label, err)
	}
	if diffID.Algorithm != "sha256" {
		return fmt.Errorf("%s: diff id algorithm %q: only sha256 is checked", label, diffID.Algorithm)
	}
	if got := hexSum(h); got != diffID.Hex {
		return fmt.Errorf("%s: corrupt layer: its content hashes to sha256:%s", label, got)
	}
	return nil
}

// readErr remembers the first read failure, so that a broken layer is
// reported as broken rather than as whatever the tar reader made of it.
type readErr struct {
	r   io.Reader
	err error
}

func (e *readErr) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF && e.err == nil {
		e.err = err
	}
	return n, err
}

func hexSum(h hash.Hash) string { return hex.EncodeToString(h.Sum(nil)) }

// treeBytes sums a folder's regular files, each hard-linked file once (as
// the image stores it), refusing the folder past max.
func treeBytes(dir string, max int64) (int64, error) {
	var n int64
	seen := map[uint64]bool{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
				if seen[st.Ino] {
					return nil
				}
				seen[st.Ino] = true
			}
			if n += fi.Size(); n > max {
				return &TooLargeError{Limit: max, What: "folder " + dir}
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// mkfsArgs are mkfs.erofs's flags for a reproducible image: one timestamp
// for every inode (-T0 with --ignore-mtime), one UUID, and the chosen
// compressor. mkfs.erofs sorts each folder's entries itself.
func mkfsArgs(compress, out, dir string) []string {
	args := []string{"-T0", "--ignore-mtime", "-U" + fixedUUID, "--quiet"}
	if compress != "none" {
		args = append(args, "-z"+compress)
	}
	return append(args, out, dir)
}

func mkfs(ctx context.Context, o Options, dir string, res *Result) error {
	o.Progress(Progress{Stage: "mkfs", Total: res.TreeBytes})
	cmd := exec.CommandContext(ctx, o.Mkfs, mkfsArgs(o.Compress, o.Out, dir)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", o.Mkfs, err, strings.TrimSpace(string(out)))
	}
	f, err := os.Open(o.Out)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return fmt.Errorf("hash %s: %w", o.Out, err)
	}
	res.Size, res.Digest = n, "sha256:"+hexSum(h)
	return nil
}
