package qemutest

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/u-root/u-root/pkg/cpio"
)

func TestRepoRoot(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "providers", "provider.go")); err != nil {
		t.Fatalf("repo root %s does not look like the repo: %v", root, err)
	}
}

func TestWriteInitramfs(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "bin")
	if err := os.WriteFile(src, []byte("#!ELF"), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out.cpio")
	if err := WriteInitramfs(out, []File{
		{Path: "/init", Source: src},
		{Path: "/etc/tether/config", Data: []byte("x=1")},
	}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := cpio.ReadAllRecords(cpio.Newc.Reader(f))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]cpio.Info{}
	for _, r := range recs {
		got[r.Name] = r.Info
	}
	tests := []struct {
		name string
		mode uint64
	}{
		{"dev", cpio.S_IFDIR | 0o755},
		{"dev/console", cpio.S_IFCHR | 0o600},
		{"proc", cpio.S_IFDIR | 0o555},
		{"sys", cpio.S_IFDIR | 0o555},
		{"init", cpio.S_IFREG | 0o755},
		{"etc/tether", cpio.S_IFDIR | 0o777},
		{"etc/tether/config", cpio.S_IFREG | 0o644},
	}
	for _, tt := range tests {
		info, ok := got[tt.name]
		if !ok {
			t.Errorf("%s missing from the archive (have %v)", tt.name, got)
			continue
		}
		if info.Mode != tt.mode {
			t.Errorf("%s mode = %o, want %o", tt.name, info.Mode, tt.mode)
		}
	}
	if c := got["dev/console"]; c.Rmajor != 5 || c.Rminor != 1 {
		t.Errorf("dev/console = %d:%d, want 5:1", c.Rmajor, c.Rminor)
	}
}

func TestWaitForLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console.log")
	if err := os.WriteFile(path, []byte("boot\nMARK one\nnoise\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if l, err := WaitForLine(ctx, path, "MARK", 1); err != nil || l != "MARK one" {
		t.Fatalf("first = %q, %v", l, err)
	}
	go func() {
		time.Sleep(50 * time.Millisecond) // the second write must come after WaitForLine starts following the file
		f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
		f.WriteString("MARK two\n")
		f.Close()
	}()
	if l, err := WaitForLine(ctx, path, "MARK", 2); err != nil || l != "MARK two" {
		t.Fatalf("second = %q, %v", l, err)
	}
	short, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	if _, err := WaitForLine(short, path, "MARK", 3); err == nil {
		t.Fatal("WaitForLine returned without the line")
	}
}

func TestTokenDigest(t *testing.T) {
	// sha256("abc"), a published test vector.
	if got := TokenDigest("abc"); got != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Fatalf("TokenDigest = %s", got)
	}
}
