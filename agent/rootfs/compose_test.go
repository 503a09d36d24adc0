package rootfs

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

var threeLayers = []Layer{
	{Name: "base:1", Path: "/m/base.erofs"},
	{Name: "tools:2", Path: "/m/tools.erofs"},
	{Name: "app:3", Path: "/m/app.erofs"},
}

func TestComposeOrderOfOperations(t *testing.T) {
	f := newFakeSys()
	r, err := Compose(f, threeLayers, "/run/tether/rootfs", "/newroot")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"mkdir /run/tether/rootfs/layers/0",
		"loop /m/base.erofs",
		"mount erofs,ro /dev/loop0 /run/tether/rootfs/layers/0 ",
		"close /dev/loop0",
		"mkdir /run/tether/rootfs/layers/1",
		"loop /m/tools.erofs",
		"mount erofs,ro /dev/loop1 /run/tether/rootfs/layers/1 ",
		"close /dev/loop1",
		"mkdir /run/tether/rootfs/layers/2",
		"loop /m/app.erofs",
		"mount erofs,ro /dev/loop2 /run/tether/rootfs/layers/2 ",
		"close /dev/loop2",
		"mkdir /run/tether/rootfs/rw",
		"mount tmpfs tmpfs /run/tether/rootfs/rw mode=0755",
		"mkdir /run/tether/rootfs/rw/upper",
		"mkdir /run/tether/rootfs/rw/work",
		"mkdir /newroot",
		// lowerdir is top first: the last layer listed wins.
		"mount overlay overlay /newroot lowerdir=/run/tether/rootfs/layers/2:/run/tether/rootfs/layers/1:/run/tether/rootfs/layers/0," +
			"upperdir=/run/tether/rootfs/rw/upper,workdir=/run/tether/rootfs/rw/work",
	}
	if !reflect.DeepEqual(f.calls, want) {
		t.Fatalf("calls:\n%s\nwant:\n%s", strings.Join(f.calls, "\n"), strings.Join(want, "\n"))
	}
	if r.Target != "/newroot" || len(r.LayerDirs) != 3 || r.UpperDir != "/run/tether/rootfs/rw/upper" {
		t.Errorf("root = %+v", r)
	}
	if len(f.openLoops) != 0 {
		t.Errorf("loop fds left open after mounting: %v", f.openLoops)
	}

	f.calls = nil
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	wantDown := []string{
		"umount /newroot",
		"umount /run/tether/rootfs/rw",
		"umount /run/tether/rootfs/layers/2",
		"umount /run/tether/rootfs/layers/1",
		"umount /run/tether/rootfs/layers/0",
	}
	if !reflect.DeepEqual(f.calls, wantDown) {
		t.Fatalf("teardown calls:\n%s\nwant:\n%s", strings.Join(f.calls, "\n"), strings.Join(wantDown, "\n"))
	}
	if len(f.mounted) != 0 {
		t.Errorf("still mounted after Close: %v", f.mounted)
	}
}

func TestComposeSingleLayer(t *testing.T) {
	f := newFakeSys()
	if _, err := Compose(f, threeLayers[:1], "/w", "/t"); err != nil {
		t.Fatal(err)
	}
	last := f.calls[len(f.calls)-1]
	if want := "mount overlay overlay /t lowerdir=/w/layers/0,upperdir=/w/rw/upper,workdir=/w/rw/work"; last != want {
		t.Fatalf("last call %q, want %q", last, want)
	}
}

// A failure at any step leaves nothing mounted and no loop device held.
func TestComposeFailureCleansUp(t *testing.T) {
	tests := []struct {
		failOn  string
		wantErr string
	}{
		{"mkdir /w/layers/0", "layer 0 (base:1)"},
		{"loop /m/base.erofs", "layer 0 (base:1)"},
		{"loop /m/tools.erofs", "layer 1 (tools:2)"},
		{"mount erofs,ro /dev/loop1", "layer 1 (tools:2): mount /dev/loop1 (/m/tools.erofs) as erofs"},
		{"mount erofs,ro /dev/loop2", "layer 2 (app:3)"},
		{"close /dev/loop1", "layer 1 (tools:2): close /dev/loop1 after mounting it"},
		{"mkdir /w/rw", "rootfs"},
		{"mount tmpfs", "upper layer"},
		{"mkdir /w/rw/work", "rootfs"},
		{"mkdir /t", "rootfs"},
		{"mount overlay", "mount overlay on /t"},
	}
	for _, tc := range tests {
		t.Run(tc.failOn, func(t *testing.T) {
			f := newFakeSys()
			f.failOn = tc.failOn
			r, err := Compose(f, threeLayers, "/w", "/t")
			if err == nil || r != nil {
				t.Fatalf("Compose = %v, %v; want an error", r, err)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %q does not contain %q", err, tc.wantErr)
			}
			if f.failOn != "" {
				t.Fatalf("injected failure %q never triggered; calls:\n%s", tc.failOn, strings.Join(f.calls, "\n"))
			}
			if len(f.mounted) != 0 {
				t.Errorf("left mounted: %v\ncalls:\n%s", f.mounted, strings.Join(f.calls, "\n"))
			}
			if len(f.openLoops) != 0 {
				t.Errorf("left loop devices open: %v", f.openLoops)
			}
		})
	}
}

func TestComposeRejectsBadArguments(t *testing.T) {
	tests := []struct {
		name            string
		layers          []Layer
		workDir, target string
		wantErr         string
	}{
		{"no layers", nil, "/w", "/t", "no layers"},
		{"relative workDir", threeLayers, "w", "/t", `workDir "w"`},
		{"unclean target", threeLayers, "/w", "/t/", `target "/t/"`},
		{"root target", threeLayers, "/w", "/", `target "/"`},
		{"comma", threeLayers, "/w,x", "/t", "must not contain"},
		{"colon", threeLayers, "/w", "/t:x", "must not contain"},
		{"nested", threeLayers, "/t/work", "/t", "must not contain each other"},
		{"empty image path", []Layer{{Name: "x"}}, "/w", "/t", "layer 0 (x) has no image path"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeSys()
			_, err := Compose(f, tc.layers, tc.workDir, tc.target)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error = %v, want it to contain %q", err, tc.wantErr)
			}
			if len(f.calls) != 0 {
				t.Errorf("made calls before validating: %q", f.calls)
			}
		})
	}
}

// A busy mount is detached lazily so teardown completes.
func TestRootCloseDetachesBusyMounts(t *testing.T) {
	f := newFakeSys()
	r, err := Compose(f, threeLayers[:1], "/w", "/t")
	if err != nil {
		t.Fatal(err)
	}
	f.calls = nil
	f.failOn, f.failErr = "umount /t", unix.EBUSY
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	want := []string{"umount /t", "umount-lazy /t", "umount /w/rw", "umount /w/layers/0"}
	if !reflect.DeepEqual(f.calls, want) {
		t.Fatalf("calls %q, want %q", f.calls, want)
	}

	// Other errors are reported, and the rest is still torn down.
	f = newFakeSys()
	r, _ = Compose(f, threeLayers[:1], "/w", "/t")
	f.failOn, f.failErr = "umount /w/rw", unix.EINVAL
	err = r.Close()
	if !errors.Is(err, unix.EINVAL) {
		t.Fatalf("Close error = %v, want EINVAL", err)
	}
	if _, ok := f.mounted["/w/layers/0"]; ok {
		t.Error("layer left mounted after a failed unmount of the upper tmpfs")
	}
}
