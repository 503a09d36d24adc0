package modules

import (
	"bytes"
	"crypto/sha256"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/mem"
)

func TestPwritevWritesEverySlice(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// More slices than one call takes, empty ones among them.
	var iov [][]byte
	var want []byte
	for i := 0; i < 2500; i++ {
		b := bytes.Repeat([]byte{byte(i)}, i%5)
		iov = append(iov, b)
		want = append(want, b...)
	}
	if err := writeAt(f, bufs(iov...), 3); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(f.Name())
	if !bytes.Equal(got, append(make([]byte, 3), want...)) {
		t.Fatalf("file holds %d bytes, want %d at offset 3", len(got), len(want))
	}
}

func bufs(b ...[]byte) mem.BufferSlice {
	var s mem.BufferSlice
	for _, x := range b {
		s = append(s, mem.SliceBuffer(x))
	}
	return s
}

func TestSinkHashesAndWritesInPlace(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	blob := randomBytes(t, 1<<20)
	p := &countingPool{}
	h := sha256.New()
	s := newSink(f, h)
	for off := 0; off < len(blob); off += 100_000 {
		end := min(off+100_000, len(blob))
		if err := s.write(int64(off), split(p, blob[off:end], (end-off)/3)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(f.Name()); !bytes.Equal(got, blob) {
		t.Fatal("file differs")
	}
	if sum := sha256.Sum256(blob); !bytes.Equal(h.Sum(nil), sum[:]) {
		t.Fatal("hash differs")
	}
	if n := p.outstanding(); n != 0 {
		t.Fatalf("%d receive buffers not returned", n)
	}
}

func TestSinkReportsWriteErrors(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path) // read-only: every write fails
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := &countingPool{}
	s := newSink(f, sha256.New())
	data := bytes.Repeat([]byte("x"), 5000)
	for i := 0; i < 20; i++ {
		if err := s.write(int64(i*len(data)), split(p, data, 2000)); err != nil {
			break // later writes fail fast once the error is seen
		}
	}
	if err := s.close(); err == nil || !strings.Contains(err.Error(), "write at offset 0") {
		t.Fatalf("close: %v, want the first write's error", err)
	}
	if n := p.outstanding(); n != 0 {
		t.Fatalf("%d receive buffers not returned after a write error", n)
	}
}
