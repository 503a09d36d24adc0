package modules

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"testing"
)

// FuzzErofsHeader uploads fuzzed bytes in fuzzed chunk sizes and checks the
// format check against a direct reading of the header: an upload is taken
// as erofs exactly when the magic sits at offset 1024, however the bytes
// were split across writes.
func FuzzErofsHeader(f *testing.F) {
	good := make([]byte, ErofsMagicOffset+64)
	binary.LittleEndian.PutUint32(good[ErofsMagicOffset:], ErofsMagic)
	f.Add(good, uint16(1))
	f.Add(good, uint16(1023))
	f.Add(good[:ErofsMagicOffset+4], uint16(1026))
	f.Add(good[:ErofsMagicOffset+3], uint16(4096))
	f.Add([]byte("not an image"), uint16(3))
	f.Add(bytes.Repeat([]byte{0xE2, 0xE1, 0xF5, 0xE0}, 300), uint16(7))
	blobs, err := OpenBlobs(f.TempDir())
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte, chunk uint16) {
		// The header is the first 1028 bytes; past a few KiB only the copy
		// runs, so longer inputs only cost time (one syscall per chunk).
		if len(data) > 8<<10 {
			data = data[:8<<10]
		}
		step := int(chunk)%2048 + 1
		u, err := blobs.Create(0, true)
		if err != nil {
			t.Fatal(err)
		}
		for off := 0; off < len(data); off += step {
			if _, err := u.Write(data[off:min(off+step, len(data))]); err != nil {
				u.Abort()
				t.Fatalf("write: %v", err)
			}
		}
		want := len(data) >= ErofsMagicOffset+4 && binary.LittleEndian.Uint32(data[ErofsMagicOffset:]) == ErofsMagic
		digest, err := u.Commit("")
		switch {
		case want && err != nil:
			t.Fatalf("a valid header (chunk %d) was refused: %v", step, err)
		case !want && !errors.Is(err, ErrNotErofs):
			t.Fatalf("a %d-byte upload without the magic was not refused as not-erofs (chunk %d): %v", len(data), step, err)
		case want:
			p, _ := blobs.Path(digest)
			stored, rerr := os.ReadFile(p)
			if rerr != nil || !bytes.Equal(stored, data) {
				t.Fatalf("stored blob differs from the upload (%v)", rerr)
			}
			// Keep the fuzzer's temp dir small: the blob was checked.
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
		}
	})
}
