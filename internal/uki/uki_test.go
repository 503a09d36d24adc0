package uki

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pierrec/lz4/v4"
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
	spec := Spec{Kernel: kernel, Initramfs: initrd, Cmdline: "console=ttyS0 tether.url=https://10.0.2.2:7443 tether.ca=sha256:ab", Compress: CompressNone}
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

// The initramfs is stored in the legacy LZ4 format the kernel unpacks,
// the same bytes every build; none stores it as given; an initramfs
// already compressed is never compressed twice; an unknown compression
// is refused before anything is written.
func TestBuildCompressesTheInitramfs(t *testing.T) {
	tl := tools(t, false)
	dir, kernel, initrd := inputs(t)
	raw, _ := os.ReadFile(initrd)
	gz := filepath.Join(dir, "initrd.gz")
	os.WriteFile(gz, append([]byte{0x1f, 0x8b, 8, 0}, bytes.Repeat([]byte("z"), 100)...), 0o644)
	gzBytes, _ := os.ReadFile(gz)
	tests := []struct {
		name      string
		initramfs string
		compress  Compression
		want      func(t *testing.T, section []byte)
	}{
		{"default is lz4", initrd, "", func(t *testing.T, sec []byte) { wantLZ4Of(t, sec, raw) }},
		{"lz4", initrd, CompressLZ4, func(t *testing.T, sec []byte) { wantLZ4Of(t, sec, raw) }},
		{"none", initrd, CompressNone, func(t *testing.T, sec []byte) {
			if !bytes.Equal(sec, raw) {
				t.Errorf(".initrd: %d bytes, want the %d given", len(sec), len(raw))
			}
		}},
		{"already gzip", gz, CompressLZ4, func(t *testing.T, sec []byte) {
			if !bytes.Equal(sec, gzBytes) {
				t.Errorf(".initrd of a gzip initramfs: %d bytes, want it stored as given (%d)", len(sec), len(gzBytes))
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var digests []string
			for i := range 2 {
				out := filepath.Join(dir, tc.name+string(rune('a'+i))+".efi")
				if err := Build(context.Background(), tl, Spec{Kernel: kernel, Initramfs: tc.initramfs, Compress: tc.compress}, out); err != nil {
					t.Fatal(err)
				}
				sec, err := Section(out, ".initrd")
				if err != nil {
					t.Fatal(err)
				}
				tc.want(t, sec)
				d, _ := Digest(out)
				digests = append(digests, d)
			}
			if digests[0] != digests[1] {
				t.Fatalf("two builds differ: %v", digests)
			}
		})
	}
	out := filepath.Join(dir, "xz.efi")
	if err := Build(context.Background(), tl, Spec{Kernel: kernel, Initramfs: initrd, Compress: "xz"}, out); err == nil || !strings.Contains(err.Error(), `"xz"`) {
		t.Fatalf("an unknown compression: %v, want a refusal naming it", err)
	}
	if _, err := os.Stat(out); err == nil {
		t.Fatal("a refused build wrote its output")
	}
}

func wantLZ4Of(t *testing.T, sec, raw []byte) {
	t.Helper()
	if !bytes.HasPrefix(sec, []byte{0x02, 0x21, 0x4c, 0x18}) {
		t.Fatalf(".initrd starts % x, want the legacy LZ4 magic the kernel reads", sec[:min(4, len(sec))])
	}
	got, err := io.ReadAll(lz4.NewReader(bytes.NewReader(sec)))
	if err != nil {
		t.Fatalf("unpack .initrd: %v", err)
	}
	if !bytes.Equal(got, raw) {
		t.Fatalf(".initrd unpacks to %d bytes, want the %d given", len(got), len(raw))
	}
}

// The image keeps its stub's COFF timestamp, with a PE checksum that
// matches its bytes, so it does not depend on when it was built
// (objcopy stamps the time of day); the checksum is computed as objcopy
// computes it.
func TestBuildKeepsTheStubsTimestamp(t *testing.T) {
	tl := tools(t, false)
	dir, kernel, initrd := inputs(t)
	out := filepath.Join(dir, "a.efi")
	if err := Build(context.Background(), tl, Spec{Kernel: kernel, Initramfs: initrd, Compress: CompressNone}, out); err != nil {
		t.Fatal(err)
	}
	_, _, stamp, err := stubEnd(DefaultStub)
	if err != nil {
		t.Fatal(err)
	}
	header := func(path string) (b []byte, gotStamp, sum uint32, sumAt int) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		pe := int(binary.LittleEndian.Uint32(b[0x3c:]))
		sumAt = pe + 4 + 20 + 64
		return b, binary.LittleEndian.Uint32(b[pe+8:]), binary.LittleEndian.Uint32(b[sumAt:]), sumAt
	}
	b, got, sum, sumAt := header(out)
	if got != stamp {
		t.Fatalf("image stamped %d, want the stub's %d", got, stamp)
	}
	if sum != 0 && peChecksum(b, sumAt) != sum {
		t.Fatalf("image checksum %#x does not match its bytes (%#x)", sum, peChecksum(b, sumAt))
	}
	// objcopy's own checksum of a copy it writes is what peChecksum gives.
	raw := filepath.Join(dir, "raw.efi")
	if err := run(context.Background(), tl.Objcopy, "--add-section", ".x="+kernel, DefaultStub, raw); err != nil {
		t.Fatal(err)
	}
	if b, _, sum, sumAt := header(raw); sum == 0 || peChecksum(b, sumAt) != sum {
		t.Fatalf("objcopy's checksum %#x, peChecksum %#x", sum, peChecksum(b, sumAt))
	}
}
