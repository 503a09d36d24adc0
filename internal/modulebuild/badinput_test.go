package modulebuild

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// TestBadTarballs: names that climb out are refused, naming the entry;
// links that point out are kept as links and writes through them land
// inside the tree. Nothing is written outside the work folder, and no
// image is left.
func TestBadTarballs(t *testing.T) {
	needMkfs(t)
	needRoot(t)
	outside := filepath.Join(t.TempDir(), "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		ents    []ent
		wantErr string // "" = the build succeeds
	}{
		{"dot-dot name", []ent{{name: "etc/", typ: tar.TypeDir}, {name: "../../evil", body: "x"}}, `tar entry "../../evil": path climbs out of the tree`},
		{"dot-dot in the middle", []ent{{name: "etc/../../evil", body: "x"}}, `tar entry "etc/../../evil": path climbs out`},
		{"absolute name", []ent{{name: "/etc/evil", body: "x"}}, `tar entry "/etc/evil": absolute path`},
		{"hard link out", []ent{{name: "hl", typ: tar.TypeLink, link: "../../etc/passwd"}}, `tar entry "hl": hard link target: tar entry "../../etc/passwd": path climbs out`},
		{"hard link to nothing", []ent{{name: "hl", typ: tar.TypeLink, link: "etc/nothing"}}, `tar entry "hl": hard link to "etc/nothing"`},
		{"unsupported type", []ent{{name: "weird", typ: 'Z'}}, `tar entry "weird": unsupported tar type`},
		{"links out are kept, writes through them stay inside", []ent{
			{name: "esc", typ: tar.TypeSymlink, link: outside},
			{name: "esc/pwned", body: "must land inside the tree"},
			{name: "up", typ: tar.TypeSymlink, link: "../../../../.."},
			{name: "up/tmp/pwned2", body: "inside too"},
		}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			work := filepath.Join(t.TempDir(), "work")
			if err := os.Mkdir(work, 0o755); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(work, "m.erofs")
			_, err := Build(t.Context(), Options{Source: "-", Stdin: bytes.NewReader(tarOf(t, c.ents...)), Out: out})
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want it to say %q", err, c.wantErr)
				}
				if ents, _ := os.ReadDir(work); len(ents) != 0 {
					t.Errorf("the work folder kept %v after a failed build", ents)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if ents, _ := os.ReadDir(outside); len(ents) != 0 {
				t.Errorf("a write escaped the tree into %s: %v", outside, ents)
			}
			if ents, _ := os.ReadDir(filepath.Dir(work)); len(ents) != 1 {
				t.Errorf("a write escaped next to the work folder: %v", ents)
			}
			if c.wantErr != "" {
				return
			}
			mnt := mountErofs(t, out)
			if l, err := os.Readlink(filepath.Join(mnt, "esc")); err != nil || l != outside {
				t.Errorf("esc -> %q (%v), want the link kept verbatim -> %s", l, err, outside)
			}
			for _, p := range []string{filepath.Join(outside, "pwned"), "tmp/pwned2"} {
				if _, err := os.Stat(filepath.Join(mnt, p)); err != nil {
					t.Errorf("%s should be in the image, resolved inside the tree: %v", p, err)
				}
			}
		})
	}
}

// TestBrokenSources: corrupt and truncated input, a tree over --max-size
// and a missing mkfs.erofs each fail with an error naming what was wrong
// and leave no image.
func TestBrokenSources(t *testing.T) {
	needMkfs(t)
	needRoot(t)
	big := tarOf(t, ent{name: "big", body: strings.Repeat("x", 4096)})
	layoutWith := func(mangle func(blob string)) string {
		dir := writeLayout(t, imageOf(t, "amd64", big))
		img, err := layout.ImageIndexFromPath(dir)
		if err != nil {
			t.Fatal(err)
		}
		im, _ := img.IndexManifest()
		i, _ := img.Image(im.Manifests[0].Digest)
		ls, _ := i.Layers()
		d, _ := ls[0].Digest()
		mangle(filepath.Join(dir, "blobs", d.Algorithm, d.Hex))
		return dir
	}
	rewrite := func(f func([]byte) []byte) func(string) {
		return func(p string) {
			b := mustRead(t, p)
			if err := os.WriteFile(p, f(b), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A blob whose gzip stream is intact but whose content is another
	// tar: only the diff ID check can catch it.
	swapped := rewrite(func([]byte) []byte { return gzipped(t, tarOf(t, ent{name: "big", body: strings.Repeat("y", 4096)})) })
	flipped := rewrite(func(b []byte) []byte { b[len(b)/2] ^= 0xff; return b })
	truncated := rewrite(func(b []byte) []byte { return b[:len(b)/2] })
	bigFolder := t.TempDir()
	if err := os.WriteFile(filepath.Join(bigFolder, "f"), make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	bigTar := filepath.Join(t.TempDir(), "big.tar")
	if err := os.WriteFile(bigTar, big, 0o644); err != nil {
		t.Fatal(err)
	}
	garbage := filepath.Join(t.TempDir(), "garbage.tar")
	if err := os.WriteFile(garbage, []byte(strings.Repeat("not a tar at all ", 100)), 0o644); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name    string
		opts    Options
		wantErr string
	}{
		{"layer with other content", Options{Source: layoutWith(swapped)}, "layer 1/1 (sha256:"},
		{"layer with a flipped byte", Options{Source: layoutWith(flipped)}, "layer 1/1 (sha256:"},
		{"truncated layer", Options{Source: layoutWith(truncated)}, "layer 1/1 (sha256:"},
		{"truncated tarball", Options{Source: "-", Stdin: bytes.NewReader(big[:1000])}, "not a tar archive, or a broken one: unexpected EOF"},
		{"not a tar", Options{Source: garbage}, "garbage.tar: not a tar archive"},
		{"tarball over --max-size", Options{Source: bigTar, MaxSize: 2048}, "larger than the limit of 2048 bytes (--max-size)"},
		{"stdin over --max-size", Options{Source: "-", Stdin: bytes.NewReader(big), MaxSize: 1000}, "standard input is larger than the limit of 1000 bytes"},
		{"image over --max-size", Options{Source: layoutWith(func(string) {}), MaxSize: 100}, "bytes of layers) is larger than the limit of 100 bytes"},
		{"folder over --max-size", Options{Source: bigFolder, MaxSize: 4095}, "is larger than the limit of 4095 bytes"},
		{"no such source", Options{Source: "./no/such/dir"}, "./no/such/dir: no such file or folder"},
		{"no such tarball is not an image name", Options{Source: "rootfs.tar.gz"}, "rootfs.tar.gz: no such file or folder"},
		{"bad reference", Options{Source: "UPPER:case:bad"}, "not a file or folder here, and not an image reference"},
		{"bad platform", Options{Source: layoutWith(func(string) {}), Platform: "linux/amd64/v2/extra"}, `--platform "linux/amd64/v2/extra"`},
		{"bad compression", Options{Source: bigFolder, Compress: "zstd"}, `--compress "zstd": want one of lz4hc, lz4, none`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			work := t.TempDir()
			c.opts.Out = filepath.Join(work, "m.erofs")
			_, err := Build(t.Context(), c.opts)
			t.Log(err)
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("err = %v, want it to say %q", err, c.wantErr)
			}
			if ents, _ := os.ReadDir(work); len(ents) != 0 {
				t.Errorf("the failed build left %v", ents)
			}
		})
	}

	t.Run("no mkfs.erofs", func(t *testing.T) {
		t.Setenv("PATH", t.TempDir())
		_, err := Build(t.Context(), Options{Source: bigFolder, Out: filepath.Join(t.TempDir(), "m.erofs")})
		if err == nil || !strings.Contains(err.Error(), "install erofs-utils") {
			t.Fatalf("err = %v, want it to name erofs-utils", err)
		}
	})
	t.Run("a too-large tree is a TooLargeError", func(t *testing.T) {
		_, err := Build(t.Context(), Options{Source: bigFolder, MaxSize: 10, Out: filepath.Join(t.TempDir(), "m.erofs")})
		var tl *TooLargeError
		if !errors.As(err, &tl) || tl.Limit != 10 {
			t.Fatalf("err = %v, want a TooLargeError with limit 10", err)
		}
	})
}

// TestReproducible: the same tree gives the same digest whether built
// twice, from a copy made in another order at another time, or from its
// tarball; a changed byte gives another digest.
func TestReproducible(t *testing.T) {
	needMkfs(t)
	needRoot(t)
	src := sourceTree(t)
	tarBytes := tarTree(t, src)
	digest := func(o Options) string {
		t.Helper()
		res, err := buildTo(t, o)
		if err != nil {
			t.Fatal(err)
		}
		return res.Digest
	}
	first := digest(Options{Source: src})
	if again := digest(Options{Source: src}); again != first {
		t.Errorf("the same folder built twice: %s then %s", first, again)
	}
	// The tarball is staged into fresh folders with new timestamps and
	// new inode numbers each time.
	fromTar := digest(Options{Source: "-", Stdin: bytes.NewReader(tarBytes)})
	if again := digest(Options{Source: "-", Stdin: bytes.NewReader(tarBytes)}); again != fromTar {
		t.Errorf("the same tarball built twice: %s then %s", fromTar, again)
	}
	// A copy written in reverse order has other readdir orders and inodes.
	rev := reversedTar(t, tarBytes)
	if got := digest(Options{Source: "-", Stdin: bytes.NewReader(rev)}); got != fromTar {
		t.Errorf("the tarball's entries in reverse order: %s, want %s", got, fromTar)
	}
	if err := os.WriteFile(filepath.Join(src, "etc/os-release"), []byte("ID=tesu\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if changed := digest(Options{Source: src}); changed == first {
		t.Errorf("a changed byte kept the digest %s: the test cannot tell trees apart", first)
	}
}

// reversedTar writes the folders of a tarball first (so parents exist),
// then every other entry in reverse order, hard links after their targets.
func reversedTar(t *testing.T, b []byte) []byte {
	t.Helper()
	type item struct {
		h    *tar.Header
		body []byte
	}
	var dirs, files, links []item
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		var body bytes.Buffer
		if _, err := body.ReadFrom(tr); err != nil {
			t.Fatal(err)
		}
		it := item{h, body.Bytes()}
		switch h.Typeflag {
		case tar.TypeDir:
			dirs = append(dirs, it)
		case tar.TypeLink:
			links = append(links, it)
		default:
			files = append([]item{it}, files...)
		}
	}
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	for _, it := range append(append(dirs, files...), links...) {
		if err := tw.WriteHeader(it.h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(it.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// TestInterruptStopsStaging: a cancelled build stops and leaves nothing.
func TestInterruptStopsStaging(t *testing.T) {
	needMkfs(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	work := t.TempDir()
	_, err := Build(ctx, Options{Source: "-", Stdin: bytes.NewReader(tarOf(t, ent{name: "a", body: "x"})), Out: filepath.Join(work, "m.erofs")})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if ents, _ := os.ReadDir(work); len(ents) != 0 {
		t.Errorf("the interrupted build left %v", ents)
	}
}

// TestWhiteoutsNameOneEntry: a whiteout that would name its own folder or
// its parent is refused, and the tree is untouched.
func TestWhiteoutsNameOneEntry(t *testing.T) {
	for _, name := range []string{"etc/.wh..", "etc/.wh...", ".wh..", "etc/.wh."} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			st := &stager{ctx: t.Context(), root: root, maxBytes: 1 << 20}
			if err := st.apply(bytes.NewReader(tarOf(t, ent{name: "etc/kept", body: "x", uid: os.Getuid(), gid: os.Getgid()})), true); err != nil {
				t.Fatal(err)
			}
			err := st.apply(bytes.NewReader(tarOf(t, ent{name: name, uid: os.Getuid(), gid: os.Getgid()})), true)
			if err == nil || !strings.Contains(err.Error(), "names no entry of its folder") {
				t.Fatalf("err = %v, want the whiteout refused", err)
			}
			if _, err := os.Stat(filepath.Join(root, "etc/kept")); err != nil {
				t.Errorf("the whiteout removed more than it named: %v", err)
			}
		})
	}
}
