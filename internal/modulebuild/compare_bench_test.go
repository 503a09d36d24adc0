package modulebuild

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	erofs "github.com/erofs/go-erofs"
)

// BenchmarkBuilders compares, on one real tree, go-erofs (which writes
// only uncompressed images) with mkfs.erofs at each compression, and
// module build itself. It is how docs/adr/0021 chose; re-run it on a quiet
// machine before quoting a figure:
//
//	TETHER_BENCH_TREE=.cache/debian-root-modbuild go test -run '^$' -bench Builders -benchtime 1x ./internal/modulebuild/
func BenchmarkBuilders(b *testing.B) {
	tree := os.Getenv("TETHER_BENCH_TREE")
	if tree == "" {
		b.Skip("SKIP: set TETHER_BENCH_TREE to a root folder (e.g. mmdebstrap --variant=minbase --include=systemd-sysv,iproute2 bookworm DIR)")
	}
	if _, err := exec.LookPath("mkfs.erofs"); err != nil {
		b.Skip("SKIP: mkfs.erofs not on PATH: install erofs-utils")
	}
	treeSize, err := treeBytes(tree, 1<<62)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("tree %s: %d bytes of files", tree, treeSize)
	out := filepath.Join(b.TempDir(), "m.erofs")
	run := func(name string, build func() error) {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				start := time.Now()
				if err := build(); err != nil {
					b.Fatal(err)
				}
				st, err := os.Stat(out)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(st.Size())/(1<<20), "MiB")
				b.ReportMetric(time.Since(start).Seconds(), "s/build")
			}
		})
	}
	run("go-erofs-uncompressed", func() error {
		f, err := os.Create(out)
		if err != nil {
			return err
		}
		defer f.Close()
		w := erofs.Create(f, erofs.WithBuildTime(0, 0), erofs.WithTempDir(filepath.Dir(out)))
		if err := w.CopyFrom(os.DirFS(tree)); err != nil {
			return err
		}
		return w.Close()
	})
	for _, z := range []string{"none", "lz4", "lz4hc"} {
		run("mkfs.erofs-"+z, func() error {
			os.Remove(out)
			o, err := exec.Command("mkfs.erofs", mkfsArgs(z, out, tree)...).CombinedOutput()
			if err != nil {
				b.Logf("%s", o)
			}
			return err
		})
	}
	run("module-build-folder", func() error {
		_, err := Build(b.Context(), Options{Source: tree, Out: out})
		return err
	})
	// The staged path: the same tree as `tar --xattrs -c` would give it.
	tarFile := filepath.Join(b.TempDir(), "root.tar")
	if o, err := exec.Command("tar", "--xattrs", "--xattrs-include=*", "--numeric-owner", "-C", tree, "-cf", tarFile, ".").CombinedOutput(); err != nil {
		b.Fatalf("tar: %v %s", err, o)
	}
	run("module-build-tarball", func() error {
		_, err := Build(b.Context(), Options{Source: tarFile, Out: out})
		return err
	})
}
