package initramfs

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/u-root/mkuimage/cpio"

	"github.com/tetherfleet/tether/agent/boot"
)

func TestParseShowDepends(t *testing.T) {
	const dir = "/k/root/lib/modules/6.1.0-57-cloud-amd64"
	tests := []struct {
		name    string
		out     string
		skip    []string
		want    []string
		wantErr string
	}{
		{
			name: "erofs with a soft dependency on crc32c-intel",
			out: "insmod " + dir + "/kernel/arch/x86/crypto/crc32c-intel.ko \n" +
				"insmod " + dir + "/kernel/lib/libcrc32c.ko \n" +
				"insmod " + dir + "/kernel/fs/erofs/erofs.ko \n",
			skip: []string{"crc32c_intel"},
			want: []string{"kernel/lib/libcrc32c.ko", "kernel/fs/erofs/erofs.ko"},
		},
		{
			name: "builtin modules are not shipped",
			out:  "builtin crc32c_generic\ninsmod " + dir + "/kernel/fs/overlayfs/overlay.ko\n",
			want: []string{"kernel/fs/overlayfs/overlay.ko"},
		},
		{name: "parameters", out: "insmod " + dir + "/kernel/a.ko debug=1\n", wantErr: "parameters are not supported"},
		{name: "compressed", out: "insmod " + dir + "/kernel/a.ko.xz\n", wantErr: "compressed"},
		{name: "outside the tree", out: "insmod /lib/modules/other/a.ko\n", wantErr: "outside"},
		{name: "unknown line", out: "install /bin/true\n", wantErr: "unexpected modprobe output"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseShowDepends([]byte(tc.out), dir, tc.skip)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// The order file must read back, through the agent's own reader, to the
// modules in the order computed.
func TestFormatOrderReadsBackInTheAgent(t *testing.T) {
	order := []string{"kernel/drivers/virtio/virtio_ring.ko", "kernel/drivers/virtio/virtio.ko"}
	b := FormatOrder("6.1.0-57-cloud-amd64", DefaultModules, DefaultSkip, order)
	got, err := boot.ReadModuleOrder(bytes.NewReader(b), "/lib/modules/6.1.0-57-cloud-amd64")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"/lib/modules/6.1.0-57-cloud-amd64/kernel/drivers/virtio/virtio_ring.ko",
		"/lib/modules/6.1.0-57-cloud-amd64/kernel/drivers/virtio/virtio.ko",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// TestBuildIsReproducible builds the initramfs twice from the real kernel
// cache and checks the bytes are identical and the layout is what the
// agent expects.
func TestBuildIsReproducible(t *testing.T) {
	kernel := os.Getenv("TETHER_KERNEL_DIR")
	if kernel == "" {
		kernel = filepath.Join("..", ".cache", "kernel")
	}
	if _, err := os.Stat(filepath.Join(kernel, "version")); err != nil {
		t.Skipf("skipped: no kernel cache at %s (run scripts/fetch-kernel.sh, or set TETHER_KERNEL_DIR)", kernel)
	}
	if _, err := exec.LookPath("modprobe"); err != nil {
		t.Skip("skipped: needs modprobe (Debian: kmod) to compute the module order")
	}
	agent := buildStaticBinary(t)
	dir := t.TempDir()
	var results []*Result
	for _, name := range []string{"a.cpio", "b.cpio"} {
		res, err := Build(Options{Agent: agent, KernelDir: kernel, Output: filepath.Join(dir, name)})
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, res)
	}
	if results[0].SHA256 != results[1].SHA256 || results[0].Size != results[1].Size {
		t.Fatalf("two builds differ: %+v vs %+v", results[0], results[1])
	}

	recs := readCPIO(t, results[0].Path)
	if r, ok := recs["init"]; !ok || r.Mode&0o777 != 0o755 || r.UID != 0 || r.MTime != 0 {
		t.Errorf("/init record = %+v", r)
	}
	if r, ok := recs["dev/console"]; !ok || r.Rmajor != 5 || r.Rminor != 1 {
		t.Errorf("/dev/console record = %+v", r)
	}
	if _, ok := recs["etc/resolv.conf"]; ok {
		t.Error("the initramfs carries mkuimage's default resolv.conf")
	}
	orderRec, ok := recs[strings.TrimPrefix(results[0].OrderFile, "/")]
	if !ok {
		t.Fatalf("no order file %s", results[0].OrderFile)
	}
	body, _ := io.ReadAll(io.NewSectionReader(orderRec, 0, int64(orderRec.FileSize)))
	modDir := "/lib/modules/" + results[0].Release
	order, err := boot.ReadModuleOrder(bytes.NewReader(body), modDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(order) == 0 {
		t.Fatal("empty module order")
	}
	names := map[string]int{}
	for i, p := range order {
		if _, ok := recs[strings.TrimPrefix(p, "/")]; !ok {
			t.Errorf("order names %s, which is not in the archive", p)
		}
		names[strings.TrimSuffix(filepath.Base(p), ".ko")] = i
	}
	for _, m := range []string{"virtio_net", "virtio_pci", "erofs", "overlay", "loop", "qemu_fw_cfg"} {
		if _, ok := names[m]; !ok {
			t.Errorf("module %s missing from the order", m)
		}
	}
	if _, ok := names["crc32c-intel"]; ok {
		t.Error("crc32c-intel is shipped")
	}
	if names["virtio_ring"] > names["virtio_net"] || names["libcrc32c"] > names["erofs"] {
		t.Errorf("dependencies after their users: %v", names)
	}
}

func buildStaticBinary(t *testing.T) string {
	t.Helper()
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module x\n\ngo 1.21\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte("package main\n\nfunc main() {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "agent")
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-o", out, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=", "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	return out
}

func readCPIO(t *testing.T, path string) map[string]cpio.Record {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	recs, err := cpio.ReadAllRecords(cpio.Newc.Reader(f))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]cpio.Record{}
	for _, r := range recs {
		m[r.Name] = r
	}
	return m
}
