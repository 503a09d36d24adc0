package uki

import (
	"bytes"
	"crypto/sha256"
	"debug/pe"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sort"
)

// PEHash is the image's Authenticode SHA-256: what UEFI firmware
// measures into PCR 4 when it loads the image (EV_EFI_BOOT_SERVICES_APPLICATION),
// and what a signature signs. It leaves out the header's checksum, the
// certificate table's directory entry and the certificate table itself;
// signing still changes it, since sbsign pads the image to 8 bytes before
// the table, so the digest to expect is the signed file's. The sections
// are hashed in file order, each its raw size, as EDK2's measurement does
// (bytes between them are not hashed), then whatever follows them short
// of the certificate table.
func PEHash(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("uki: %w", err)
	}
	h, err := peHash(b)
	if err != nil {
		return nil, fmt.Errorf("uki: %s: %w", path, err)
	}
	return h, nil
}

const securityDir = 4 // IMAGE_DIRECTORY_ENTRY_SECURITY

func peHash(b []byte) ([]byte, error) {
	if len(b) < 0x40 || b[0] != 'M' || b[1] != 'Z' {
		return nil, errors.New("not a PE image (no MZ header)")
	}
	peOff := int(binary.LittleEndian.Uint32(b[0x3c:]))
	if peOff < 0 || peOff+24 > len(b) || string(b[peOff:peOff+4]) != "PE\x00\x00" {
		return nil, errors.New("not a PE image (no PE signature)")
	}
	opt := peOff + 24
	if opt+2 > len(b) {
		return nil, errors.New("truncated optional header")
	}
	var dirs, nDirsOff int
	switch magic := binary.LittleEndian.Uint16(b[opt:]); magic {
	case 0x20b: // PE32+
		nDirsOff, dirs = opt+108, opt+112
	case 0x10b: // PE32
		nDirsOff, dirs = opt+92, opt+96
	default:
		return nil, fmt.Errorf("unknown optional header magic %#x", magic)
	}
	if dirs > len(b) {
		return nil, errors.New("truncated optional header")
	}
	checksum := opt + 64
	headers := int(binary.LittleEndian.Uint32(b[opt+60:]))
	if headers > len(b) || headers < dirs {
		return nil, fmt.Errorf("SizeOfHeaders %d is outside the file", headers)
	}
	hash := sha256.New()
	hash.Write(b[:checksum])
	certSize := 0
	if n := int(binary.LittleEndian.Uint32(b[nDirsOff:])); n > securityDir {
		cert := dirs + securityDir*8
		if cert+8 > headers {
			return nil, errors.New("the certificate table's directory entry is outside the headers")
		}
		hash.Write(b[checksum+4 : cert])
		hash.Write(b[cert+8 : headers])
		certSize = int(binary.LittleEndian.Uint32(b[cert+4:]))
	} else {
		hash.Write(b[checksum+4 : headers])
	}
	f, err := pe.NewFile(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	secs := append([]*pe.Section(nil), f.Sections...)
	sort.SliceStable(secs, func(i, j int) bool { return secs[i].Offset < secs[j].Offset })
	sum := headers
	for _, s := range secs {
		if s.Size == 0 {
			continue
		}
		start, end := int(s.Offset), int(s.Offset)+int(s.Size)
		if end > len(b) || start > end {
			return nil, fmt.Errorf("section %s lies outside the file", s.Name)
		}
		hash.Write(b[start:end])
		sum += int(s.Size)
	}
	if end := len(b) - certSize; end > sum {
		hash.Write(b[sum:end])
	}
	return hash.Sum(nil), nil
}
