// Package tinymodule builds small erofs modules in memory and pushes them
// over the admin API: the fixtures of tests and of the load tools
// (tether-bench, chaos), which must not link testing code.
package tinymodule

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"io"
	"sync"
	"testing/fstest"

	erofs "github.com/erofs/go-erofs"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

var (
	tinyOnce sync.Once
	tiny     []byte
)

// Image is a small valid erofs image (built once with go-erofs).
func Image() []byte {
	tinyOnce.Do(func() {
		tiny = Build(fstest.MapFS{
			"etc/os-release": {Data: []byte("NAME=\"Tether Test\"\nID=tether-test\n")},
			"hello.txt":      {Data: []byte("hello from a module\n")},
		})
	})
	return append([]byte(nil), tiny...)
}

// Build packs a file tree into an uncompressed erofs image.
func Build(files fstest.MapFS) []byte {
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

// Push streams data to the admin API as module name:version, in 64 KiB
// chunks, declaring its digest and size.
func Push(ctx context.Context, c v1.AdminServiceClient, name, version string, data []byte) (*v1.Module, error) {
	stream, err := c.PushModule(ctx)
	if err != nil {
		return nil, err
	}
	if err := stream.Send(&v1.PushModuleRequest{Msg: &v1.PushModuleRequest_Header{Header: &v1.PushModuleHeader{
		Name: name, Version: version, Digest: Digest(data), Size: int64(len(data))}}}); err != nil {
		return stream.CloseAndRecv()
	}
	for off := 0; off < len(data); off += 64 << 10 {
		end := min(off+64<<10, len(data))
		if err := stream.Send(&v1.PushModuleRequest{Msg: &v1.PushModuleRequest_Chunk{Chunk: data[off:end]}}); err != nil {
			return stream.CloseAndRecv()
		}
	}
	return stream.CloseAndRecv()
}
