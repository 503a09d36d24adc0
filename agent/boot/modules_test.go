package boot

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestReadModuleOrder(t *testing.T) {
	const dir = "/lib/modules/6.1.0-57-cloud-amd64"
	tests := []struct {
		name    string
		in      string
		want    []string
		wantErr string
	}{
		{
			name: "relative and absolute, comments and blanks",
			in: "# computed by modprobe --show-depends\n\n" +
				"kernel/drivers/virtio/virtio_ring.ko\n" +
				"  kernel/drivers/virtio/virtio.ko  \n" +
				"/opt/extra/thing.ko\n",
			want: []string{
				dir + "/kernel/drivers/virtio/virtio_ring.ko",
				dir + "/kernel/drivers/virtio/virtio.ko",
				"/opt/extra/thing.ko",
			},
		},
		{name: "empty", in: "", want: nil},
		{name: "params are not supported", in: "kernel/a.ko debug=1\n", wantErr: "line 1"},
		{name: "compressed module", in: "# x\nkernel/a.ko.xz\n", wantErr: `line 2: "kernel/a.ko.xz" is not an uncompressed .ko`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReadModuleOrder(strings.NewReader(tc.in), dir)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want it to contain %q", err, tc.wantErr)
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

// Loading real modules into the test machine's kernel is not something a
// test may do; the failure path (which names the module) is checked here,
// the success path by the VM boot (initramfs/floor/run.sh).
func TestLoadModulesNamesTheFailingModule(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "kernel", "fs", "erofs", "erofs.ko")
	err := LoadModules([]string{missing})
	if err == nil || !strings.Contains(err.Error(), "load module erofs") {
		t.Fatalf("LoadModules error = %v, want it to name module erofs", err)
	}
}
