package uki

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// tools skips loudly without objcopy, sbsign or the stub.
func tools(t *testing.T, sign bool) Tools {
	t.Helper()
	tl, err := FindTools(sign)
	if err == nil {
		_, err = os.Stat(DefaultStub)
	}
	if err != nil {
		msg := "SKIPPING " + t.Name() + ": " + err.Error()
		os.Stderr.WriteString(msg + "\n")
		t.Skip(msg)
	}
	return tl
}

func inputs(t *testing.T) (dir, kernel, initrd string) {
	t.Helper()
	dir = t.TempDir()
	kernel, initrd = filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initrd")
	os.WriteFile(kernel, bytes.Repeat([]byte("K"), 123457), 0o644)
	os.WriteFile(initrd, bytes.Repeat([]byte("I"), 65537), 0o644)
	return dir, kernel, initrd
}

// The image carries each input as its section, byte for byte, and the
// same inputs give the same image.
func TestBuildIsReproducibleAndCarriesItsInputs(t *testing.T) {
	tl := tools(t, false)
	dir, kernel, initrd := inputs(t)
	spec := Spec{Kernel: kernel, Initramfs: initrd, Cmdline: "console=ttyS0 tether.url=https://10.0.2.2:7443 tether.ca=sha256:ab"}
	a, b := filepath.Join(dir, "a.efi"), filepath.Join(dir, "b.efi")
	for _, out := range []string{a, b} {
		if err := Build(context.Background(), tl, spec, out); err != nil {
			t.Fatal(err)
		}
	}
	da, _ := Digest(a)
	db, _ := Digest(b)
	if da != db {
		t.Fatalf("two builds of the same inputs differ: %s, %s", da, db)
	}
	for name, want := range map[string]string{".cmdline": spec.Cmdline, ".linux": strings.Repeat("K", 123457), ".initrd": strings.Repeat("I", 65537)} {
		got, err := Section(a, name)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Errorf("%s: %d bytes, want %d", name, len(got), len(want))
		}
	}
	if err := Build(context.Background(), tl, spec, a); err == nil {
		t.Fatal("a build overwrote an existing image")
	}
}

func TestBuildRefuses(t *testing.T) {
	tl := tools(t, false)
	dir, kernel, initrd := inputs(t)
	tests := []struct {
		name string
		spec Spec
		want string
	}{
		{"a newline in the command line", Spec{Kernel: kernel, Initramfs: initrd, Cmdline: "console=ttyS0\ninit=/bin/sh"}, "control character"},
		{"a command line too long", Spec{Kernel: kernel, Initramfs: initrd, Cmdline: strings.Repeat("x", MaxCmdline)}, "at most"},
		{"no kernel", Spec{Initramfs: initrd}, "no kernel"},
		{"a missing initramfs", Spec{Kernel: kernel, Initramfs: filepath.Join(dir, "nope")}, "initramfs"},
		{"a stub that is not PE", Spec{Stub: kernel, Kernel: kernel, Initramfs: initrd}, "not a PE image"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(dir, "out", tc.name)
			os.MkdirAll(filepath.Dir(out), 0o755)
			err := Build(context.Background(), tl, tc.spec, out)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("case %d: Build = %v, want %q", i, err, tc.want)
			}
			if _, err := os.Stat(out); err == nil {
				t.Fatal("a refused build wrote its output")
			}
		})
	}
	// An image is not a stub: its sections would be added twice.
	img := filepath.Join(dir, "img.efi")
	if err := Build(context.Background(), tl, Spec{Kernel: kernel, Initramfs: initrd}, img); err != nil {
		t.Fatal(err)
	}
	if err := Build(context.Background(), tl, Spec{Stub: img, Kernel: kernel, Initramfs: initrd}, filepath.Join(dir, "twice.efi")); err == nil ||
		!strings.Contains(err.Error(), "already has") {
		t.Fatalf("building on an image: %v", err)
	}
}
