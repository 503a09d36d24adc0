package testcp

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"io"
	"sync"
	"testing/fstest"

	erofs "github.com/erofs/go-erofs"
)

var (
	tinyOnce sync.Once
	tiny     []byte
)

// TinyErofs is a small valid erofs image (built once with go-erofs).
func TinyErofs() []byte {
	tinyOnce.Do(func() {
		tiny = BuildErofs(fstest.MapFS{
			"etc/os-release": {Data: []byte("NAME=\"Tether Test\"\nID=tether-test\n")},
			"hello.txt":      {Data: []byte("hello from a module\n")},
		})
	})
	return append([]byte(nil), tiny...)
}

// BuildErofs packs a file tree into an uncompressed erofs image.
func BuildErofs(files fstest.MapFS) []byte {
	var buf seekBuffer
	w := erofs.Create(&buf, erofs.WithBuildTime(0, 0))
	if err := w.CopyFrom(files); err != nil {
		panic(err)
	}
	if err := w.Close(); err != nil {
		panic(err)
	}
	if binary.LittleEndian.Uint32(buf.b[1024:]) != 0xE0F5E1E2 {
		panic("go-erofs image lacks the superblock magic")
	}
	return buf.b
}

// Digest is sha256:<hex> of data.
func Digest(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

type seekBuffer struct {
	b   []byte
	off int64
}

func (s *seekBuffer) Write(p []byte) (int, error) {
	end := s.off + int64(len(p))
	if end > int64(len(s.b)) {
		s.b = append(s.b, make([]byte, end-int64(len(s.b)))...)
	}
	copy(s.b[s.off:], p)
	s.off = end
	return len(p), nil
}

func (s *seekBuffer) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
		s.off = offset
	case io.SeekCurrent:
		s.off += offset
	case io.SeekEnd:
		s.off = int64(len(s.b)) + offset
	}
	return s.off, nil
}
