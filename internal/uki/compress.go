package uki

import (
	"bytes"
	"fmt"
	"io"
	"os"

	"github.com/pierrec/lz4/v4"
)

// Compression is how Build stores the initramfs in the image.
type Compression string

const (
	// CompressLZ4 stores the initramfs in the legacy LZ4 format, the one
	// the kernel's initramfs unpacker reads (CONFIG_RD_LZ4). Firmware
	// downloads the whole image and, under Secure Boot, hashes all of it
	// before the stub runs, so every byte costs twice before the kernel
	// starts; LZ4 takes Tether's initramfs from 16 to 7 MB and the kernel
	// unpacks it in about the time it copies the raw one
	// (docs/benchmarks.md, "A signed UKI").
	CompressLZ4 Compression = "lz4"
	// CompressNone stores the initramfs as given.
	CompressNone Compression = "none"
)

// ParseCompression reads a --compress value ("" is the default, lz4).
func ParseCompression(s string) (Compression, error) {
	switch Compression(s) {
	case "", CompressLZ4:
		return CompressLZ4, nil
	case CompressNone:
		return CompressNone, nil
	}
	return "", fmt.Errorf("uki: unknown initramfs compression %q (want lz4 or none)", s)
}

// compressedMagics are the formats the kernel unpacks an initramfs from;
// an initramfs already in one is stored as it is.
var compressedMagics = []struct {
	name  string
	magic []byte
}{
	{"gzip", []byte{0x1f, 0x8b}},
	{"bzip2", []byte("BZh")},
	{"lzma", []byte{0x5d, 0x00, 0x00}},
	{"xz", []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}},
	{"lzo", []byte{0x89, 'L', 'Z', 'O', 0x00}},
	{"lz4", []byte{0x02, 0x21, 0x4c, 0x18}},
	{"zstd", []byte{0x28, 0xb5, 0x2f, 0xfd}},
}

// compressedAs names the compression head starts with, or "" for none.
func compressedAs(head []byte) string {
	for _, m := range compressedMagics {
		if bytes.HasPrefix(head, m.magic) {
			return m.name
		}
	}
	return ""
}

// stageInitramfs returns the file Build puts in .initrd: src itself, or a
// compressed copy written under dir. The same input gives the same bytes.
func stageInitramfs(src, dir string, c Compression) (string, error) {
	if c == CompressNone {
		return src, nil
	}
	in, err := os.Open(src)
	if err != nil {
		return "", fmt.Errorf("uki: initramfs: %w", err)
	}
	defer in.Close()
	head := make([]byte, 8)
	n, err := io.ReadFull(in, head)
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		return "", fmt.Errorf("uki: initramfs: %w", err)
	}
	if compressedAs(head[:n]) != "" {
		return src, nil
	}
	if _, err := in.Seek(0, io.SeekStart); err != nil {
		return "", fmt.Errorf("uki: initramfs: %w", err)
	}
	dst := dir + "/initrd.lz4"
	out, err := os.Create(dst)
	if err != nil {
		return "", fmt.Errorf("uki: %w", err)
	}
	w := lz4.NewWriter(out)
	// One goroutine: the block boundaries, and so the bytes, never depend
	// on scheduling.
	if err := w.Apply(lz4.LegacyOption(true), lz4.CompressionLevelOption(lz4.Level9), lz4.ConcurrencyOption(1)); err != nil {
		out.Close()
		return "", fmt.Errorf("uki: lz4: %w", err)
	}
	if _, err := io.Copy(w, in); err != nil {
		out.Close()
		return "", fmt.Errorf("uki: compress the initramfs: %w", err)
	}
	if err := w.Close(); err != nil {
		out.Close()
		return "", fmt.Errorf("uki: compress the initramfs: %w", err)
	}
	if err := out.Close(); err != nil {
		return "", fmt.Errorf("uki: %w", err)
	}
	return dst, nil
}
