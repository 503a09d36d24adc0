package e2e

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/tetherctl"
	tv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// TestVMRootFromOCILayout: a root that arrives as an OCI image — the
// example root as its lower layer, an upper layer that deletes one file by
// whiteout and adds another — is built by `tetherctl module build`, pushed,
// and boots to running; a task sees the upper layer applied.
func TestVMRootFromOCILayout(t *testing.T) {
	env := newVMEnv(t)
	ctx := vmCtx(t)
	if os.Geteuid() != 0 {
		t.Skip("SKIP (real-VM e2e): not root: the test mounts the example root to make its layer, and staging an image sets owners")
	}
	for _, tool := range []string{"mkfs.erofs", "tar", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("SKIP (real-VM e2e): %s is not on PATH", tool)
		}
	}
	work := t.TempDir()
	mnt := filepath.Join(work, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "erofs", "-o", "loop,ro", env.a.rootModule, mnt).CombinedOutput(); err != nil {
		t.Skipf("SKIP (real-VM e2e): cannot mount %s as erofs: %v %s", env.a.rootModule, err, out)
	}
	lower := filepath.Join(work, "lower.tar")
	out, err := exec.Command("tar", "--xattrs", "--numeric-owner", "-C", mnt, "-cf", lower, ".").CombinedOutput()
	if uerr := exec.Command("umount", mnt).Run(); uerr != nil {
		t.Errorf("umount %s: %v", mnt, uerr)
	}
	if err != nil {
		t.Fatalf("tar the example root: %v %s", err, out)
	}
	lowerLayer, err := tarball.LayerFromFile(lower)
	if err != nil {
		t.Fatal(err)
	}
	upperLayer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(upperTar(t))), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, lowerLayer, upperLayer)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(work, "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, layout.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"})); err != nil {
		t.Fatal(err)
	}

	var stdout, stderr bytes.Buffer
	args := []string{"--config", filepath.Join(env.cp.DataDir, daemon.AdminDir, daemon.ClientConfig), "--endpoint", env.cp.Addr,
		"module", "build", dir, "oci-root:1", "--work-dir", work}
	if code := tetherctl.Main(args, &stdout, &stderr); code != 0 {
		t.Fatalf("module build: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
	t.Logf("module build: %s", strings.TrimSpace(stderr.String()))
	if _, err := env.cp.Admin.CreateTemplate(ctx, &tv1.CreateTemplateRequest{Name: "oci-root", RootModules: []*tv1.ModuleRef{{Name: "oci-root", Version: "1"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.cp.Admin.CreateNode(ctx, &tv1.CreateNodeRequest{Name: "oci-root", Template: "oci-root"}); err != nil {
		t.Fatal(err)
	}
	env.node = "oci-root"
	id := env.provision(t, ctx)
	env.waitRunning(t, ctx, id, nil)
	got := env.exec(t, ctx, id, "/bin/sh", "-c", "cat /etc/tether-oci-layer; test -e /etc/profile && echo profile-still-there; cat /etc/os-release")
	if !strings.Contains(got, "from the upper layer") || strings.Contains(got, "profile-still-there") || !strings.Contains(got, "ID=tether-example") {
		t.Fatalf("the booted root is not the two layers applied:\n%s", got)
	}
}

// upperTar is the image's upper layer: a whiteout of a file the lower
// layer has and a new file.
func upperTar(t *testing.T) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	body := "from the upper layer\n"
	for _, h := range []*tar.Header{
		{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "etc/.wh.profile", Typeflag: tar.TypeReg, Mode: 0o644},
		{Name: "etc/tether-oci-layer", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			if _, err := tw.Write([]byte(body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}
