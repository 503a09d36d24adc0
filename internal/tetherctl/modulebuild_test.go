package tetherctl_test

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	gv1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
)

func writeTar(t *testing.T, names ...string) string {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, n := range names {
		if err := tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o644, Size: 2}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte("x\n")); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "root.tar")
	if err := os.WriteFile(p, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// armLayout writes an OCI layout holding one linux/arm64 image.
func armLayout(t *testing.T) string {
	t.Helper()
	img, err := random.Image(256, 1)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "arm64"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, layout.WithPlatform(gv1.Platform{OS: "linux", Architecture: "arm64"})); err != nil {
		t.Fatal(err)
	}
	return dir
}

// module build refuses bad input by name and pushes nothing; good input
// is pushed; --no-push -o json prints the build, whose digest is the kept
// file's.
func TestModuleBuildPushesOnlyGoodInput(t *testing.T) {
	if _, err := exec.LookPath("mkfs.erofs"); err != nil {
		t.Skip("SKIP: mkfs.erofs not on PATH: install erofs-utils")
	}
	if os.Geteuid() != 0 {
		t.Skip("SKIP: not root: staging a tarball sets owners")
	}
	cp := testcp.Start(t)
	base := []string{"--config", filepath.Join(cp.DataDir, daemon.AdminDir, daemon.ClientConfig), "--endpoint", cp.Addr}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{writeTar(t, "etc/ok", "../../evil"), "bad:1"}, `tar entry "../../evil": path climbs out of the tree`},
		{[]string{writeTar(t, "/etc/passwd"), "bad:2"}, `tar entry "/etc/passwd": absolute path`},
		{[]string{writeTar(t, "big"), "bad:3", "--max-size", "1"}, "larger than the limit of 1 bytes"},
		{[]string{writeTar(t, "x"), "bad:4", "--max-size", "huge"}, `--max-size: "huge"`},
		{[]string{writeTar(t, "x"), "bad:5", "--no-push"}, "--no-push needs --keep"},
		{[]string{writeTar(t, "x"), "no-version"}, `"no-version": want NAME:VERSION`},
		{[]string{armLayout(t), "bad:6"}, "has no image for linux/amd64 (it has linux/arm64); choose one with --platform"},
	} {
		_, errOut, code := run(t, append(append(base, "module", "build"), c.args...)...)
		if code == 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("module build %v: exit %d, stderr %q; want an error saying %q", c.args, code, errOut, c.want)
		}
	}
	out, errOut, code := run(t, append(base, "module", "list", "-o", "json")...)
	if code != 0 || strings.Contains(out, "bad") {
		t.Fatalf("after failed builds, module list: exit %d %s %s; want no module pushed", code, out, errOut)
	}

	if out, errOut, code := run(t, append(base, "module", "build", writeTar(t, "etc/os-release"), "good:1", "--compress", "lz4")...); code != 0 {
		t.Fatalf("module build: %s %s", out, errOut)
	} else if !strings.Contains(errOut, "lz4 image sha256:") {
		t.Errorf("stderr %q lacks the build summary", errOut)
	}
	if _, errOut, code := run(t, append(base, "module", "get", "good:1")...); code != 0 {
		t.Fatalf("module get good:1: %s", errOut)
	}

	keep := filepath.Join(t.TempDir(), "kept.erofs")
	out, errOut, code = run(t, append(base, "module", "build", writeTar(t, "etc/os-release"), "kept:1", "--no-push", "--keep", keep, "-o", "json")...)
	if code != 0 {
		t.Fatalf("--no-push: %s", errOut)
	}
	var res struct {
		Kind, Digest, Compress string
		Size                   int64
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("-o json is not one JSON document: %v\n%s", err, out)
	}
	b, err := os.ReadFile(keep)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	if res.Digest != "sha256:"+hex.EncodeToString(sum[:]) || res.Size != int64(len(b)) || res.Kind != "tar" || res.Compress != "lz4hc" {
		t.Errorf("build JSON %+v does not describe the kept image (%d bytes)", res, len(b))
	}
	if out, _, _ := run(t, append(base, "module", "list", "-o", "json")...); strings.Contains(out, "kept") {
		t.Errorf("--no-push pushed: %s", out)
	}
}
