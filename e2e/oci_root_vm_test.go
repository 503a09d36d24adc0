package e2e

import (
	"archive/tar"
	"bytes"
	"context"
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
	requireLayoutTools(t)
	work := t.TempDir()
	mnt := filepath.Join(work, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "erofs", "-o", "loop,ro", env.a.rootModule, mnt).CombinedOutput(); err != nil {
		t.Skipf("SKIP (real-VM e2e): cannot mount %s as erofs: %v %s", env.a.rootModule, err, out)
	}
	dir := writeLayout(t, work, mnt)
	if uerr := exec.Command("umount", mnt).Run(); uerr != nil {
		t.Errorf("umount %s: %v", mnt, uerr)
	}
	id := bootLayout(t, ctx, env, work, dir, "oci-root")
	got := env.exec(t, ctx, id, "/bin/sh", "-c", "cat /etc/tether-oci-layer; test -e /etc/profile && echo profile-still-there; cat /etc/os-release")
	if !strings.Contains(got, "from the upper layer") || strings.Contains(got, "profile-still-there") || !strings.Contains(got, "ID=tether-example") {
		t.Fatalf("the booted root is not the two layers applied:\n%s", got)
	}
}

// TestVMDebianRootFromOCILayout is the same with the stock Debian tree
// (systemd) as the lower layer: the image boots to running, PID 1 is
// systemd with the agent back under it, and the upper layer is applied.
func TestVMDebianRootFromOCILayout(t *testing.T) {
	env := newDebianEnv(t)
	ctx := debianCtx(t)
	requireLayoutTools(t)
	work := t.TempDir()
	dir := writeLayout(t, work, filepath.Join(filepath.Dir(debianModulePath(t)), "debian-root"))
	id := bootLayout(t, ctx, env, work, dir, "oci-debian")
	checkSystemd(t, env, ctx, id)
	got := env.exec(t, ctx, id, "/bin/sh", "-c", "cat /etc/tether-oci-layer; test -e /etc/profile && echo profile-still-there; true")
	if !strings.Contains(got, "from the upper layer") || strings.Contains(got, "profile-still-there") {
		t.Fatalf("the booted root is not the two layers applied:\n%s", got)
	}
}

func requireLayoutTools(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIP (real-VM e2e): not root: the test mounts the example root to make its layer, and staging an image sets owners")
	}
	for _, tool := range []string{"mkfs.erofs", "tar", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("SKIP (real-VM e2e): %s is not on PATH", tool)
		}
	}
}

// writeLayout writes an OCI image layout in work whose image is tree as
// its lower layer and upperTar above it, and returns the layout's folder.
func writeLayout(t *testing.T, work, tree string) string {
	t.Helper()
	lower := filepath.Join(work, "lower.tar")
	if out, err := exec.Command("tar", "--xattrs", "--xattrs-include=*", "--numeric-owner", "-C", tree, "-cf", lower, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar %s: %v %s", tree, err, out)
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
	return dir
}

// bootLayout builds the layout with `tetherctl module build`, puts it on a
// template and node called name, and boots the node to running.
func bootLayout(t *testing.T, ctx context.Context, env *vmEnv, work, dir, name string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	args := []string{"--config", filepath.Join(env.cp.DataDir, daemon.AdminDir, daemon.ClientConfig), "--endpoint", env.cp.Addr,
		"module", "build", dir, name + ":1", "--work-dir", work}
	if code := tetherctl.Main(args, &stdout, &stderr); code != 0 {
		t.Fatalf("module build: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
	t.Logf("module build: %s", strings.TrimSpace(stderr.String()))
	if _, err := env.cp.Admin.CreateTemplate(ctx, &tv1.CreateTemplateRequest{Name: name, RootModules: []*tv1.ModuleRef{{Name: name, Version: "1"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.cp.Admin.CreateNode(ctx, &tv1.CreateNodeRequest{Name: name, Template: name}); err != nil {
		t.Fatal(err)
	}
	env.node = name
	id := env.provision(t, ctx)
	env.waitRunning(t, ctx, id, nil)
	return id
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
