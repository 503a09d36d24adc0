package seediso

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"time"
)

// MaxImageBytes bounds the image the reader will load. Seed ISOs written by
// Write are 1 MiB, and ones made by genisoimage are a few hundred KiB.
const MaxImageBytes = 8 << 20

const (
	sectorSize      = 2048
	firstVDSector   = 16
	maxVDs          = 32
	maxDirRecords   = 4096
	maxCEChainDepth = 8
	maxCEs          = 256
)

// go-diskfs trusts the sizes an image declares: a path table, directory or
// SUSP continuation area of 4 GiB is allocated before it is read, and a
// continuation area that points at itself is followed forever. Either would
// take PID 1 (and so the kernel) down on a small node, from a disk anybody
// who can attach media controls. So before go-diskfs sees an image, it is
// loaded into memory (bounded) and every size that drives an allocation is
// checked against the image's length here.

// loadImage reads the primary volume descriptor, refuses anything that is
// not an ISO 9660 image labelled TETHERSEED, and returns the whole image.
func loadImage(r io.ReaderAt) ([]byte, error) {
	var pvd []byte
	for i := 0; i < maxVDs; i++ {
		vd := make([]byte, sectorSize)
		n, err := r.ReadAt(vd, int64(firstVDSector+i)*sectorSize)
		if n < sectorSize {
			return nil, fmt.Errorf("%w: no ISO 9660 volume descriptor (%v)", ErrNotSeed, err)
		}
		if string(vd[1:6]) != "CD001" {
			return nil, fmt.Errorf("%w: no ISO 9660 signature", ErrNotSeed)
		}
		if vd[0] == 1 {
			pvd = vd
			break
		}
		if vd[0] == 255 {
			break
		}
	}
	if pvd == nil {
		return nil, fmt.Errorf("%w: no primary volume descriptor", ErrNotSeed)
	}
	if label := TrimLabel(string(pvd[40:72])); label != Label {
		return nil, fmt.Errorf("%w: volume label is %q, want %q", ErrNotSeed, label, Label)
	}
	if bs := binary.LittleEndian.Uint16(pvd[128:130]); bs != sectorSize {
		return nil, fmt.Errorf("seed ISO has logical block size %d, want %d", bs, sectorSize)
	}
	size := int64(binary.LittleEndian.Uint32(pvd[80:84])) * sectorSize
	if size > MaxImageBytes {
		return nil, fmt.Errorf("seed ISO declares %d bytes, more than the %d a seed may have", size, MaxImageBytes)
	}
	img := make([]byte, size)
	n, err := r.ReadAt(img, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read seed ISO: %w", err)
	}
	return img[:n], nil
}

// checkImage verifies that every declared extent go-diskfs will allocate
// for lies inside img.
func checkImage(img []byte) error {
	c := checker{img: img, seen: make(map[uint32]bool)}
	for i := 0; i < maxVDs; i++ {
		off := (firstVDSector + i) * sectorSize
		if off+sectorSize > len(img) {
			return errors.New("volume descriptors run past the end of the image")
		}
		vd := img[off : off+sectorSize]
		if vd[0] == 255 {
			break
		}
		if vd[0] != 1 && vd[0] != 2 {
			continue
		}
		if err := c.volume(vd); err != nil {
			return err
		}
	}
	return c.continuations()
}

type checker struct {
	img     []byte
	seen    map[uint32]bool
	records int
}

func (c *checker) within(what string, start, length uint64) error {
	if start > uint64(len(c.img)) || length > uint64(len(c.img))-start {
		return fmt.Errorf("%s (%d bytes at %d) lies outside the %d-byte image", what, length, start, len(c.img))
	}
	return nil
}

func (c *checker) volume(vd []byte) error {
	bs := uint64(binary.LittleEndian.Uint16(vd[128:130]))
	ptSize := uint64(binary.LittleEndian.Uint32(vd[132:136]))
	ptLoc := uint64(binary.LittleEndian.Uint32(vd[140:144]))
	if err := c.within("path table", ptLoc*bs, ptSize); err != nil {
		return err
	}
	if err := c.pathTable(c.img[ptLoc*bs : ptLoc*bs+ptSize]); err != nil {
		return err
	}
	return c.record(vd[156 : 156+34])
}

// pathTable checks each directory the path table points at: go-diskfs
// reads the directory's size from its first record and allocates it.
func (c *checker) pathTable(pt []byte) error {
	for i := 0; i+8 <= len(pt); {
		nameLen := int(pt[i])
		loc := uint64(binary.LittleEndian.Uint32(pt[i+2 : i+6]))
		if err := c.within("path table directory", loc*sectorSize, 34); err != nil {
			return err
		}
		if err := c.record(c.img[loc*sectorSize : loc*sectorSize+34]); err != nil {
			return err
		}
		i += 8 + nameLen + nameLen%2
	}
	return nil
}

// record checks one directory record's extent and, for a directory, every
// record inside it.
func (c *checker) record(r []byte) error {
	if c.records++; c.records > maxDirRecords {
		return fmt.Errorf("more than %d directory records", maxDirRecords)
	}
	loc := binary.LittleEndian.Uint32(r[2:6])
	size := uint64(binary.LittleEndian.Uint32(r[10:14]))
	start := uint64(loc) * sectorSize
	if err := c.within("extent", start, size); err != nil {
		return err
	}
	if r[25]&0x02 == 0 || c.seen[loc] {
		return nil
	}
	c.seen[loc] = true
	dir := c.img[start : start+size]
	for i := 0; i < len(dir); {
		n := int(dir[i])
		if n == 0 {
			// Records do not cross sectors; the rest of this one is padding.
			i = (i/sectorSize + 1) * sectorSize
			continue
		}
		if n < 34 || i+n > len(dir) {
			return fmt.Errorf("directory record of %d bytes at %d is malformed", n, start+uint64(i))
		}
		if err := c.record(dir[i : i+n]); err != nil {
			return err
		}
		i += n
	}
	return nil
}

// continuations finds everything shaped like a SUSP continuation entry
// ("CE", length 28, version 1) anywhere in the image, checks that its area
// lies inside the image, and refuses chains that loop or run long. Looking
// at every byte rather than only at parsed records is deliberately
// conservative: a seed ISO has no reason to carry anything that looks
// like a broken chain.
func (c *checker) continuations() error {
	type area struct{ start, end uint64 }
	var ces []int
	var areas []area
	for i := 0; ; {
		j := bytes.Index(c.img[i:], []byte{'C', 'E', 28, 1})
		if j < 0 {
			break
		}
		p := i + j
		i = p + 1
		if p+28 > len(c.img) {
			return errors.New("truncated SUSP continuation entry")
		}
		e := c.img[p : p+28]
		loc := uint64(binary.LittleEndian.Uint32(e[4:8]))
		off := uint64(binary.LittleEndian.Uint32(e[12:16]))
		n := uint64(binary.LittleEndian.Uint32(e[20:24]))
		if err := c.within("SUSP continuation area", loc*sectorSize+off, n); err != nil {
			return err
		}
		if len(ces) == maxCEs {
			return fmt.Errorf("more than %d SUSP continuation entries", maxCEs)
		}
		ces = append(ces, p)
		areas = append(areas, area{loc*sectorSize + off, loc*sectorSize + off + n})
	}
	// An entry whose area holds another entry continues into it.
	depth := make([]int, len(ces)) // 0 unknown, -1 in progress
	var walk func(k int) (int, error)
	walk = func(k int) (int, error) {
		switch depth[k] {
		case -1:
			return 0, errors.New("SUSP continuation entries form a loop")
		case 0:
		default:
			return depth[k], nil
		}
		depth[k] = -1
		d := 1
		for m, p := range ces {
			if uint64(p) >= areas[k].start && uint64(p) < areas[k].end {
				dm, err := walk(m)
				if err != nil {
					return 0, err
				}
				d = max(d, dm+1)
			}
		}
		if d > maxCEChainDepth {
			return 0, fmt.Errorf("SUSP continuation chain longer than %d", maxCEChainDepth)
		}
		depth[k] = d
		return d, nil
	}
	for k := range ces {
		if _, err := walk(k); err != nil {
			return err
		}
	}
	return nil
}

// memImage serves a loaded image to go-diskfs as a read-only file.
type memImage struct {
	*bytes.Reader
}

func (memImage) Close() error { return nil }

func (m memImage) Stat() (fs.FileInfo, error) { return memInfo{size: m.Size()}, nil }

type memInfo struct{ size int64 }

func (memInfo) Name() string       { return "seed.iso" }
func (i memInfo) Size() int64      { return i.size }
func (memInfo) Mode() fs.FileMode  { return 0o444 }
func (memInfo) ModTime() time.Time { return time.Time{} }
func (memInfo) IsDir() bool        { return false }
func (memInfo) Sys() any           { return nil }
