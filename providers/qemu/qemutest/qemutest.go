// Package qemutest is shared plumbing for tests that boot real VMs: finding
// the repository root, fetching the Debian cloud kernel, building static Go
// binaries and packing them into an initramfs, and reading a console log.
// It is an ordinary package (not a _test file) so that e2e tests can use it.
//
// Helpers that cannot do their job on this host skip the test loudly (to
// stderr as well as through t.Skip), naming what is missing, so that a skip
// is never mistaken for a pass.
package qemutest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/u-root/u-root/pkg/cpio"
)

// ModulePath is the repository's Go module.
const ModulePath = "github.com/tetherfleet/tether"

// Lines the tiny init prints (mirrored in providers/qemu/testdata/tinyinit).
const (
	// TinyInitMarker is printed alone on a line once the tiny init is up.
	TinyInitMarker = "TETHER-TINYINIT-READY"
	// TokenDigestPrefix starts the line that carries the SHA-256 of the
	// token the guest read from fw_cfg.
	TokenDigestPrefix = "TETHER-TINYINIT: token-sha256="
	// URLPrefix starts the line with the control plane URL from fw_cfg.
	URLPrefix = "TETHER-TINYINIT: url="
)

// TinyInitPackage is the tiny init's package, relative to the repo root.
const TinyInitPackage = "./providers/qemu/testdata/tinyinit"

// TokenDigest is what the tiny init prints after TokenDigestPrefix for a
// token.
func TokenDigest(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// SkipLoudly skips the test with a message that also goes to stderr, so it
// shows without -v.
func SkipLoudly(tb testing.TB, format string, args ...any) {
	tb.Helper()
	msg := fmt.Sprintf("SKIP %s: ", tb.Name()) + fmt.Sprintf(format, args...)
	fmt.Fprintln(os.Stderr, msg)
	tb.Skip(msg)
}

// RepoRoot walks up from the working directory (a test's package directory)
// to the directory whose go.mod declares ModulePath.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && modulePathOf(b) == ModulePath {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod for %s above the working directory", ModulePath)
		}
		dir = parent
	}
}

func modulePathOf(gomod []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`)
		}
	}
	return ""
}

// MustRepoRoot is RepoRoot for tests.
func MustRepoRoot(tb testing.TB) string {
	tb.Helper()
	root, err := RepoRoot()
	if err != nil {
		tb.Fatalf("repo root: %v", err)
	}
	return root
}

// RequireQEMU returns the path of qemu-system-x86_64, or skips loudly.
func RequireQEMU(tb testing.TB) string {
	tb.Helper()
	p, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		SkipLoudly(tb, "qemu-system-x86_64 not found in PATH (install the qemu-system-x86 package): %v", err)
	}
	return p
}

// Kernel is the Debian cloud kernel fetched by scripts/fetch-kernel.sh.
type Kernel struct {
	Path       string // the bzImage
	Release    string // e.g. 6.1.0-57-cloud-amd64
	ModulesDir string // .../lib/modules/<release>
}

// FetchKernel runs scripts/fetch-kernel.sh from the repo root (a no-op when
// .cache/kernel is already filled) and skips loudly when it fails.
func FetchKernel(tb testing.TB) Kernel {
	tb.Helper()
	root := MustRepoRoot(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", "fetch-kernel.sh"))
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		SkipLoudly(tb, "cannot fetch the kernel with scripts/fetch-kernel.sh: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	rel := strings.TrimSpace(string(out))
	cache := filepath.Join(root, ".cache", "kernel")
	k := Kernel{
		Path:       filepath.Join(cache, "vmlinuz"),
		Release:    rel,
		ModulesDir: filepath.Join(cache, "root", "lib", "modules", rel),
	}
	if _, err := os.Stat(k.Path); err != nil {
		SkipLoudly(tb, "scripts/fetch-kernel.sh left no kernel: %v", err)
	}
	return k
}

// Module returns the path of a kernel module (name without .ko) from the
// kernel's modules.dep.
func (k Kernel) Module(name string) (string, error) {
	dep, err := os.ReadFile(filepath.Join(k.ModulesDir, "modules.dep"))
	if err != nil {
		return "", err
	}
	sc := bufio.NewScanner(bytes.NewReader(dep))
	for sc.Scan() {
		mod, _, _ := strings.Cut(sc.Text(), ":")
		if path.Base(mod) == name+".ko" {
			return filepath.Join(k.ModulesDir, mod), nil
		}
	}
	return "", fmt.Errorf("module %s not in %s/modules.dep", name, k.ModulesDir)
}

// BuildStatic builds the Go main package pkg (a path relative to the repo
// root, like "./cmd/tether-agent") as a static linux/amd64 binary at out.
func BuildStatic(tb testing.TB, pkg, out string) {
	tb.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gobin, "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = MustRepoRoot(tb)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if b, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
}

// File is one regular file in an initramfs.
type File struct {
	// Path inside the initramfs, e.g. "/init".
	Path string
	// Source is a host file to copy; Data is used when Source is empty.
	Source string
	Data   []byte
	// Mode is the permission bits (default 0755 when from a host file that
	// is executable, else 0644).
	Mode uint64
}

// WriteInitramfs writes a newc cpio archive at out with the skeleton a
// kernel needs to run /init with a console (/dev with a console node 5:1,
// /proc, /sys, /tmp) plus files. Parent directories are created as needed.
func WriteInitramfs(out string, files []File) error {
	recs := []cpio.Record{
		cpio.Directory("dev", 0o755),
		// Without /dev/console in the initramfs, init runs with no
		// stdout and every line it prints is lost.
		cpio.CharDev("dev/console", 0o600, 5, 1),
		cpio.Directory("proc", 0o555),
		cpio.Directory("sys", 0o555),
		cpio.Directory("tmp", 0o1777),
	}
	for _, f := range files {
		data := f.Data
		mode := f.Mode
		if f.Source != "" {
			b, err := os.ReadFile(f.Source)
			if err != nil {
				return fmt.Errorf("initramfs %s: %w", f.Path, err)
			}
			data = b
			if mode == 0 {
				mode = 0o644
				if fi, err := os.Stat(f.Source); err == nil && fi.Mode()&0o111 != 0 {
					mode = 0o755
				}
			}
		}
		if mode == 0 {
			mode = 0o644
		}
		recs = append(recs, cpio.StaticRecord(data, cpio.Info{
			Name: strings.TrimPrefix(path.Clean("/"+f.Path), "/"),
			Mode: cpio.S_IFREG | mode,
		}))
	}
	cpio.MakeAllReproducible(recs)

	fh, err := os.Create(out)
	if err != nil {
		return err
	}
	w := cpio.NewDedupWriter(cpio.Newc.Writer(fh))
	werr := cpio.WriteRecordsAndDirs(w, recs)
	if werr == nil {
		werr = cpio.WriteTrailer(w)
	}
	return errors.Join(werr, fh.Close())
}

// TinyInitramfs builds the tiny init (TinyInitPackage) and packs it as /init
// with the kernel's qemu_fw_cfg module (so the guest can read fw_cfg) into
// an initramfs in a temporary directory. It returns the archive's path.
func TinyInitramfs(tb testing.TB, k Kernel) string {
	tb.Helper()
	dir := tb.TempDir()
	bin := filepath.Join(dir, "init")
	BuildStatic(tb, TinyInitPackage, bin)
	files := []File{{Path: "/init", Source: bin, Mode: 0o755}}
	if ko, err := k.Module("qemu_fw_cfg"); err == nil {
		files = append(files, File{Path: "/qemu_fw_cfg.ko", Source: ko})
	} else {
		tb.Logf("no qemu_fw_cfg module (%v): the guest will not see fw_cfg", err)
	}
	out := filepath.Join(dir, "initramfs.cpio")
	if err := WriteInitramfs(out, files); err != nil {
		tb.Fatalf("write initramfs: %v", err)
	}
	return out
}

// Lines returns the lines of the file at path that contain substr.
func Lines(path, substr string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, substr) {
			out = append(out, strings.TrimRight(l, "\r"))
		}
	}
	return out
}

// WaitForLine polls the file at path until it has at least n lines
// containing substr, and returns the n-th one. n counts from 1, so a test can
// wait for the marker of a second boot in an appended console log.
func WaitForLine(ctx context.Context, path, substr string, n int) (string, error) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if ls := Lines(path, substr); len(ls) >= n {
			return ls[n-1], nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("waiting for line %d containing %q in %s: %w", n, substr, path, ctx.Err())
		case <-tick.C:
		}
	}
}

// ProcessGone reports whether pid no longer exists (kill -0 fails) or is
// a zombie nobody reaped.
func ProcessGone(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return true
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}
