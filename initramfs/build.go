// Package initramfs builds the netboot initramfs: the agent as /init (PID
// 1), the kernel modules it loads with their load order, and a busybox for
// the console, written as a reproducible cpio with u-root's mkuimage.
package initramfs

import (
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/u-root/mkuimage/cpio"
	"github.com/u-root/mkuimage/uimage"
	"github.com/u-root/uio/llog"

	"github.com/tetherfleet/tether/agent/boot"
	"github.com/tetherfleet/tether/pki"
)

// Options are the inputs of Build. The same inputs give the same bytes.
type Options struct {
	// Agent is the static agent binary; it becomes /init.
	Agent string
	// KernelDir is the kernel cache of scripts/fetch-kernel.sh: a version
	// file and root/lib/modules/<release>/.
	KernelDir string
	// Busybox is a static busybox for the console's debug shell (/bin/sh);
	// empty leaves the shell out.
	Busybox string
	// Modules to ship, with their dependencies; default DefaultModules.
	Modules []string
	// Skip are modules never shipped; default DefaultSkip.
	Skip []string
	// Signers are signer public key files (from `tetherctl signer create`)
	// baked in as the node's signer anchor, /etc/tether/signers/*.pub.
	Signers []string
	// Output is the cpio file to write.
	Output string
	// Logger receives mkuimage's messages; nil uses its default.
	Logger *llog.Logger
}

// Result describes a built initramfs.
type Result struct {
	Path      string
	Size      int64
	SHA256    string // hex
	Release   string
	OrderFile string   // path inside the initramfs
	Order     []string // relative to /lib/modules/<release>
}

// Build writes the initramfs. Its layout:
//
//	/init                                   the agent (PID 1)
//	/bin/busybox, /bin/sh -> busybox        debug shell (optional)
//	/lib/modules/<release>/kernel/...ko     the modules
//	/lib/modules/<release>/tether.order     their load order
//	/dev/console, /dev/null                 for the kernel and PID 1's stdio before devtmpfs
//	/etc/tether/signers/<fp>.pub            signer anchor keys (optional)
//	/dev /proc /sys /run /tmp /etc          mount points and scratch
func Build(opts Options) (*Result, error) {
	if opts.Agent == "" || opts.KernelDir == "" || opts.Output == "" {
		return nil, errors.New("initramfs: agent, kernel dir and output are required")
	}
	if opts.Modules == nil {
		opts.Modules = DefaultModules
	}
	if opts.Skip == nil {
		opts.Skip = DefaultSkip
	}
	if opts.Logger == nil {
		opts.Logger = llog.Default()
	}
	if err := requireStatic(opts.Agent); err != nil {
		return nil, err
	}
	if opts.Busybox != "" {
		if err := requireStatic(opts.Busybox); err != nil {
			return nil, err
		}
	}
	b, err := os.ReadFile(filepath.Join(opts.KernelDir, "version"))
	if err != nil {
		return nil, fmt.Errorf("initramfs: kernel release (run scripts/fetch-kernel.sh): %w", err)
	}
	release := strings.TrimSpace(string(b))
	root := filepath.Join(opts.KernelDir, "root")
	order, err := ModuleOrder(root, release, opts.Modules, opts.Skip)
	if err != nil {
		return nil, err
	}

	tmp, err := os.MkdirTemp("", "tether-initramfs-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)

	// Stage every file with the mode it should have: the archive takes
	// modes from the host files, and the inputs' own modes vary.
	stage := filepath.Join(tmp, "stage")
	modDir := filepath.Join("lib", "modules", release)
	files := []string{filepath.Join(stage, "init") + ":init"}
	if err := copyFile(opts.Agent, filepath.Join(stage, "init"), 0o755); err != nil {
		return nil, err
	}
	if opts.Busybox != "" {
		if err := copyFile(opts.Busybox, filepath.Join(stage, "bin", "busybox"), 0o755); err != nil {
			return nil, err
		}
		files = append(files, filepath.Join(stage, "bin")+":bin")
	}
	for _, rel := range order {
		if err := copyFile(filepath.Join(root, modDir, rel), filepath.Join(stage, modDir, rel), 0o644); err != nil {
			return nil, err
		}
	}
	orderPath := filepath.Join(stage, modDir, boot.ModuleOrderName)
	if err := writeFile(orderPath, FormatOrder(release, opts.Modules, opts.Skip, order), 0o644); err != nil {
		return nil, err
	}
	files = append(files, filepath.Join(stage, "lib")+":lib")
	if len(opts.Signers) > 0 {
		if err := StageSigners(filepath.Join(stage, "etc", "tether", "signers"), opts.Signers); err != nil {
			return nil, err
		}
		files = append(files, filepath.Join(stage, "etc", "tether")+":etc/tether")
	}
	if err := filepath.Walk(stage, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.IsDir() {
			err = os.Chmod(p, 0o755)
		}
		return err
	}); err != nil {
		return nil, err
	}

	mods := []uimage.Modifier{
		uimage.WithBaseArchive(baseArchive()),
		uimage.WithFiles(files...),
		uimage.WithSkipLDD(), // everything is static; ldd would only add host noise
		uimage.WithCPIOOutput(opts.Output),
		uimage.WithTempDir(tmp),
	}
	if opts.Busybox != "" {
		mods = append(mods, uimage.WithSymlink("bin/sh", "/bin/busybox"))
	}
	if err := uimage.Create(opts.Logger, mods...); err != nil {
		return nil, fmt.Errorf("initramfs: mkuimage: %w", err)
	}

	sum, size, err := digest(opts.Output)
	if err != nil {
		return nil, err
	}
	return &Result{
		Path: opts.Output, Size: size, SHA256: sum, Release: release,
		OrderFile: "/" + filepath.Join(modDir, boot.ModuleOrderName), Order: order,
	}, nil
}

// baseArchive replaces mkuimage's default base, which carries an
// /etc/resolv.conf naming a public resolver and directories u-root's own
// init uses; the agent needs mount points and the two device nodes the
// kernel opens before /init can mount devtmpfs.
func baseArchive() *cpio.Archive {
	a, _ := cpio.ArchiveFromRecords([]cpio.Record{
		cpio.Directory("dev", 0o755),
		cpio.CharDev("dev/console", 0o600, 5, 1),
		cpio.CharDev("dev/null", 0o666, 1, 3),
		cpio.Directory("etc", 0o755),
		cpio.Directory("proc", 0o755),
		cpio.Directory("run", 0o755),
		cpio.Directory("sys", 0o755),
		cpio.Directory("tmp", 0o1777),
	})
	return a
}

// requireStatic refuses a dynamically linked binary: the initramfs has no
// libc, so it would fail only at boot, with an unhelpful "not found".
func requireStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("initramfs: %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("initramfs: %s is dynamically linked; build it with CGO_ENABLED=0 (or use busybox-static)", path)
		}
	}
	return nil
}

func copyFile(src, dst string, perm os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	return writeFile(dst, b, perm)
}

func writeFile(dst string, b []byte, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	if err := os.WriteFile(dst, b, perm); err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	if err := os.Chmod(dst, perm); err != nil { // WriteFile's mode is masked by the umask
		return fmt.Errorf("initramfs: %w", err)
	}
	return nil
}

func digest(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, fmt.Errorf("initramfs: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, fmt.Errorf("initramfs: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// StageSigners copies signer public keys into dir, each checked and named
// after its fingerprint, so a wrong file (a private key, a certificate)
// fails the build instead of a boot.
func StageSigners(dir string, files []string) error {
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("initramfs: signer: %w", err)
		}
		pub, err := pki.ParseSignerPublicKey(raw)
		if err != nil {
			return fmt.Errorf("initramfs: signer %s: %w", f, err)
		}
		pemBytes, err := pki.SignerPublicPEM(pub)
		if err != nil {
			return fmt.Errorf("initramfs: signer %s: %w", f, err)
		}
		name := strings.TrimPrefix(pki.SignerFingerprint(pub), "sha256:") + ".pub"
		if err := writeFile(filepath.Join(dir, name), pemBytes, 0o644); err != nil {
			return err
		}
	}
	return nil
}
