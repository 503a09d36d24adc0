// Package uki builds and signs a unified kernel image: systemd's EFI stub
// with the kernel, Tether's initramfs and a kernel command line joined
// into one PE file, so that under UEFI Secure Boot one signature covers
// all three and the node's trust settings (tether.url, the CA
// fingerprint, the signer anchors) cannot be changed without breaking it.
//
// The sections are added with binutils' objcopy at addresses computed
// from the stub's own section table (debug/pe), each aligned to the
// stub's section alignment with no gap between them, which is what
// sbverify and the firmware's loader expect. Signing uses sbsign.
package uki

import (
	"bytes"
	"context"
	"crypto/sha256"
	"debug/pe"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// DefaultStub is Debian's systemd EFI stub (package systemd-boot-efi).
const DefaultStub = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub"

// MaxCmdline bounds the command line: the kernel's own limit on x86.
const MaxCmdline = 2048

// Spec is what goes into the image.
type Spec struct {
	Stub, Kernel, Initramfs string
	Cmdline                 string
	// OSRelease is the .osrel section (default: a Tether node's).
	OSRelease string
	// Compress is how the initramfs is stored ("": lz4). An initramfs
	// already compressed is stored as given.
	Compress Compression
}

// Sections, in the order they are added after the stub's own.
var sectionOrder = []string{".osrel", ".cmdline", ".linux", ".initrd"}

// Tools are the external programs, looked up on PATH.
type Tools struct{ Objcopy, Sbsign string }

// FindTools looks objcopy and sbsign up, naming the package of each that
// is missing. sign says whether sbsign is needed.
func FindTools(sign bool) (Tools, error) {
	var t Tools
	var err error
	if t.Objcopy, err = exec.LookPath("objcopy"); err != nil {
		return t, errors.New("uki: objcopy not found: install binutils")
	}
	if sign {
		if t.Sbsign, err = exec.LookPath("sbsign"); err != nil {
			return t, errors.New("uki: sbsign not found: install sbsigntool")
		}
	}
	return t, nil
}

// CheckCmdline refuses a command line the kernel would cut or that would
// smuggle a second line into the image.
func CheckCmdline(c string) error {
	if len(c) >= MaxCmdline {
		return fmt.Errorf("uki: the command line is %d bytes; the kernel takes at most %d", len(c), MaxCmdline-1)
	}
	if i := strings.IndexFunc(c, func(r rune) bool { return r < 0x20 || r == 0x7f }); i >= 0 {
		return fmt.Errorf("uki: the command line holds a control character at byte %d", i)
	}
	return nil
}

// Build writes the unsigned image to out (which must not exist). The same
// inputs give the same bytes.
func Build(ctx context.Context, t Tools, s Spec, out string) error {
	if s.Stub == "" {
		s.Stub = DefaultStub
	}
	if s.OSRelease == "" {
		s.OSRelease = "ID=tether\nNAME=\"Tether node\"\nPRETTY_NAME=\"Tether netboot node\"\n"
	}
	if err := CheckCmdline(s.Cmdline); err != nil {
		return err
	}
	compress, err := ParseCompression(string(s.Compress))
	if err != nil {
		return err
	}
	for _, f := range []struct{ flag, path string }{{"stub", s.Stub}, {"kernel", s.Kernel}, {"initramfs", s.Initramfs}} {
		if f.path == "" {
			return fmt.Errorf("uki: no %s given", f.flag)
		}
		if _, err := os.Stat(f.path); err != nil {
			if f.flag == "stub" {
				return fmt.Errorf("uki: the EFI stub %s: %w (install systemd-boot-efi)", f.path, err)
			}
			return fmt.Errorf("uki: %s: %w", f.flag, err)
		}
	}
	if _, err := os.Stat(out); err == nil {
		return fmt.Errorf("uki: %s exists; refusing to overwrite it", out)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(out), ".uki-")
	if err != nil {
		return fmt.Errorf("uki: %w", err)
	}
	defer os.RemoveAll(tmp)
	osrel, cmdline := filepath.Join(tmp, "os-release"), filepath.Join(tmp, "cmdline")
	if err := os.WriteFile(osrel, []byte(s.OSRelease), 0o644); err != nil {
		return fmt.Errorf("uki: %w", err)
	}
	// The stub passes .cmdline to the kernel as it is: no trailing newline.
	if err := os.WriteFile(cmdline, []byte(s.Cmdline), 0o644); err != nil {
		return fmt.Errorf("uki: %w", err)
	}
	initrd, err := stageInitramfs(s.Initramfs, tmp, compress)
	if err != nil {
		return err
	}
	files := map[string]string{".osrel": osrel, ".cmdline": cmdline, ".linux": s.Kernel, ".initrd": initrd}
	next, align, stamp, err := stubEnd(s.Stub)
	if err != nil {
		return err
	}
	args := []string{}
	for _, name := range sectionOrder {
		st, err := os.Stat(files[name])
		if err != nil {
			return fmt.Errorf("uki: %w", err)
		}
		args = append(args, "--add-section", name+"="+files[name], "--change-section-vma", fmt.Sprintf("%s=0x%x", name, next))
		next = alignUp(next+uint64(st.Size()), align)
	}
	staged := filepath.Join(tmp, "uki.efi")
	args = append(args, s.Stub, staged)
	if err := run(ctx, t.Objcopy, args...); err != nil {
		return err
	}
	if err := restamp(staged, stamp); err != nil {
		return err
	}
	return os.Rename(staged, out)
}

// stubEnd returns where the first added section goes (the end of the
// stub's last section, aligned), the stub's section alignment and its
// COFF timestamp.
func stubEnd(stub string) (next, align uint64, stamp uint32, err error) {
	f, err := pe.Open(stub)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("uki: the EFI stub %s is not a PE image: %w", stub, err)
	}
	defer f.Close()
	var base uint64
	switch h := f.OptionalHeader.(type) {
	case *pe.OptionalHeader64:
		base, align = h.ImageBase, uint64(h.SectionAlignment)
	case *pe.OptionalHeader32:
		base, align = uint64(h.ImageBase), uint64(h.SectionAlignment)
	default:
		return 0, 0, 0, fmt.Errorf("uki: the EFI stub %s has no optional header", stub)
	}
	if align == 0 {
		return 0, 0, 0, fmt.Errorf("uki: the EFI stub %s has a section alignment of 0", stub)
	}
	for _, s := range f.Sections {
		for _, want := range sectionOrder {
			if s.Name == want {
				return 0, 0, 0, fmt.Errorf("uki: %s already has a %s section: give the bare stub, not an image", stub, want)
			}
		}
		size := max(uint64(s.VirtualSize), uint64(s.Size))
		next = max(next, base+uint64(s.VirtualAddress)+size)
	}
	return alignUp(next, align), align, f.FileHeader.TimeDateStamp, nil
}

func alignUp(n, a uint64) uint64 { return (n + a - 1) / a * a }

// restamp gives the image the COFF timestamp stamp and the PE checksum
// that goes with it. objcopy (binutils 2.40, which ignores
// SOURCE_DATE_EPOCH for PE) stamps what it writes with the time of day and
// checksums that, so two builds of the same inputs differed whenever a
// second passed between them, and a digest pinned in a measured-boot
// policy could not be rebuilt. The image keeps its stub's stamp.
func restamp(path string, stamp uint32) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("uki: %w", err)
	}
	if len(b) < 0x40 {
		return fmt.Errorf("uki: %s is too short for a PE image", path)
	}
	// "PE\0\0", then the COFF header: Machine, NumberOfSections,
	// TimeDateStamp; the optional header's CheckSum is 64 bytes into it.
	pe := int(binary.LittleEndian.Uint32(b[0x3c:]))
	stampAt, sumAt := pe+8, pe+4+20+64
	if sumAt+4 > len(b) || string(b[pe:pe+4]) != "PE\x00\x00" {
		return fmt.Errorf("uki: %s has no PE header where its DOS header points", path)
	}
	binary.LittleEndian.PutUint32(b[stampAt:], stamp)
	if binary.LittleEndian.Uint32(b[sumAt:]) != 0 {
		binary.LittleEndian.PutUint32(b[sumAt:], peChecksum(b, sumAt))
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("uki: %w", err)
	}
	return nil
}

// peChecksum is the PE image checksum (the one the Windows loader and
// objcopy compute): 16-bit words summed with the carry folded back, the
// CheckSum field itself counted as zero, plus the file's length.
func peChecksum(b []byte, sumAt int) uint32 {
	var sum uint32
	for i := 0; i < len(b); i += 2 {
		var w uint32
		switch {
		case i == sumAt || i == sumAt+2:
			continue
		case i+1 < len(b):
			w = uint32(binary.LittleEndian.Uint16(b[i:]))
		default:
			w = uint32(b[i])
		}
		sum += w
		sum = (sum & 0xffff) + (sum >> 16)
	}
	sum = (sum & 0xffff) + (sum >> 16)
	return sum + uint32(len(b))
}

// Signer is a Secure Boot db key and its certificate (PEM files; the key
// unencrypted).
type Signer struct{ Key, Cert string }

// Sign writes a signed copy of in to out (which must not exist).
func Sign(ctx context.Context, t Tools, s Signer, in, out string) error {
	if s.Key == "" || s.Cert == "" {
		return errors.New("uki: signing needs both --key and --cert")
	}
	for _, p := range []string{s.Key, s.Cert, in} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("uki: %w", err)
		}
	}
	if _, err := os.Stat(out); err == nil {
		return fmt.Errorf("uki: %s exists; refusing to overwrite it", out)
	}
	tmp := out + ".signing"
	_ = os.Remove(tmp)
	if err := run(ctx, t.Sbsign, "--key", s.Key, "--cert", s.Cert, "--output", tmp, in); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, out)
}

func run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("uki: %s: %w: %s", filepath.Base(name), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// Section returns the bytes of one section of a built image (its virtual
// size: the file's section is padded to the file alignment).
func Section(path, name string) ([]byte, error) {
	f, err := pe.Open(path)
	if err != nil {
		return nil, fmt.Errorf("uki: %s: %w", path, err)
	}
	defer f.Close()
	s := f.Section(name)
	if s == nil {
		return nil, fmt.Errorf("uki: %s has no %s section", path, name)
	}
	b, err := io.ReadAll(io.LimitReader(s.Open(), int64(min(s.VirtualSize, s.Size))))
	if err != nil {
		return nil, fmt.Errorf("uki: %s %s: %w", path, name, err)
	}
	return b, nil
}

// Digest is the file's sha256:<hex>.
func Digest(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}
