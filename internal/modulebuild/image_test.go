package modulebuild

import (
	"archive/tar"
	"bytes"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Two layers: the upper one deletes a file, hides a folder's old content,
// writes through a lower layer's folder symlink, and replaces a file by a
// folder.
var (
	lowerLayer = []ent{
		{name: "etc/", typ: tar.TypeDir},
		{name: "etc/gone", body: "deleted above"},
		{name: "etc/kept", body: "kept"},
		{name: "var/cache/", typ: tar.TypeDir},
		{name: "var/cache/old/", typ: tar.TypeDir},
		{name: "var/cache/old/blob", body: "hidden above"},
		{name: "usr/lib/", typ: tar.TypeDir},
		{name: "lib", typ: tar.TypeSymlink, link: "usr/lib"},
		{name: "opt/thing", body: "a file, then a folder"},
	}
	upperLayer = []ent{
		{name: "etc/.wh.gone"},
		{name: "var/cache/", typ: tar.TypeDir},
		{name: "var/cache/.wh..wh..opq"},
		{name: "var/cache/new", body: "new"},
		{name: "lib/libnew.so", body: "through the link"},
		{name: "opt/thing/", typ: tar.TypeDir},
		{name: "opt/thing/inside", body: "inside"},
	}
)

// checkLayered asserts the mounted tree is lower with upper applied.
func checkLayered(t *testing.T, mnt string) {
	t.Helper()
	exists := map[string]bool{
		"etc/gone": false, "etc/kept": true, "var/cache/old": false, "var/cache/new": true,
		"usr/lib/libnew.so": true, "opt/thing/inside": true,
	}
	for p, want := range exists {
		_, err := os.Lstat(filepath.Join(mnt, p))
		if got := err == nil; got != want {
			t.Errorf("%s exists=%v, want %v (err %v)", p, got, want, err)
		}
	}
	if l, err := os.Readlink(filepath.Join(mnt, "lib")); err != nil || l != "usr/lib" {
		t.Errorf("lib -> %q (%v), want the link kept -> usr/lib", l, err)
	}
}

func TestImageSources(t *testing.T) {
	needMkfs(t)
	needRoot(t)
	amd := imageOf(t, "amd64", tarOf(t, lowerLayer...), tarOf(t, upperLayer...))
	arm := imageOf(t, "arm64", tarOf(t, ent{name: "etc/arm", body: "wrong arch"}))

	reg := httptest.NewServer(registry.New())
	t.Cleanup(reg.Close)
	host := strings.TrimPrefix(reg.URL, "http://")
	push := func(repo string, img v1.Image) string {
		ref, err := name.ParseReference(host + "/" + repo)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(ref, img); err != nil {
			t.Fatal(err)
		}
		return ref.String()
	}
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}})
	multiRef, err := name.ParseReference(host + "/multi:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(multiRef, idx); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "saved.tar")
	tag, _ := name.NewTag("example/app:1")
	if err := tarball.WriteToFile(archive, tag, amd); err != nil {
		t.Fatal(err)
	}

	ociArchive := filepath.Join(t.TempDir(), "oci.tar")
	if err := os.WriteFile(ociArchive, tarTree(t, writeLayout(t, arm, amd)), 0o644); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name string
		opts Options
		kind Kind
	}{
		{"oci layout in a tar", Options{Source: ociArchive}, KindOCIArchive},
		{"registry image", Options{Source: push("app:1", amd)}, KindImage},
		{"registry index picks amd64", Options{Source: multiRef.String()}, KindImage},
		{"oci layout with two platforms", Options{Source: writeLayout(t, arm, amd)}, KindOCILayout},
		{"docker save archive", Options{Source: archive}, KindDockerArchive},
		{"docker save on stdin", Options{Source: "-", Stdin: bytes.NewReader(mustRead(t, archive))}, KindDockerArchive},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.opts.Out = filepath.Join(t.TempDir(), "m.erofs")
			res, err := Build(t.Context(), c.opts)
			if err != nil {
				t.Fatal(err)
			}
			if res.Kind != c.kind || res.Layers != 2 || res.Platform != "linux/amd64" {
				t.Errorf("result %+v, want kind %s, 2 layers, linux/amd64", res, c.kind)
			}
			checkLayered(t, mountErofs(t, c.opts.Out))
		})
	}

	t.Run("registry index for arm64 with --platform", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "m.erofs")
		if _, err := Build(t.Context(), Options{Source: multiRef.String(), Platform: "linux/arm64", Out: out}); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(mountErofs(t, out), "etc/arm")); err != nil {
			t.Errorf("the arm64 image's file is missing: %v", err)
		}
	})

	// An image for another architecture is refused, naming both.
	armOnly := push("armonly:1", arm)
	armIdx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}})
	armIdxRef, _ := name.ParseReference(host + "/armidx:1")
	if err := remote.WriteIndex(armIdxRef, armIdx); err != nil {
		t.Fatal(err)
	}
	for _, src := range []string{armOnly, armIdxRef.String(), writeLayout(t, arm)} {
		t.Run("wrong platform "+src, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "m.erofs")
			_, err := Build(t.Context(), Options{Source: src, Out: out})
			var pe *PlatformError
			if !errors.As(err, &pe) || !strings.Contains(err.Error(), "linux/arm64") || !strings.Contains(err.Error(), "linux/amd64") {
				t.Fatalf("err = %v, want a PlatformError naming linux/arm64 and linux/amd64", err)
			}
			if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("an image was left at %s", out)
			}
		})
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
