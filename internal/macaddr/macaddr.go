// Package macaddr validates and normalises Ethernet hardware addresses, the
// key that binds a netbooting machine to its node. One spelling per address
// (lower case, colon separated) keeps the store's uniqueness honest: the
// same NIC written two ways must not belong to two nodes.
package macaddr

import (
	"fmt"
	"strings"
)

// Normalize returns s as six lower-case, colon-separated octets. It accepts
// colons or dashes as separators (iPXE's ${net0/mac} uses colons, pxelinux's
// BOOTIF dashes) and nothing else: no other lengths, no dotted form, no
// surrounding space. Multicast and all-zero addresses are refused: no NIC
// boots with one, so such a value is a typing mistake.
func Normalize(s string) (string, error) {
	if len(s) != 17 {
		return "", fmt.Errorf("hardware address %q: want six hex octets like 52:54:00:12:34:56", clip(s))
	}
	sep := s[2]
	if sep != ':' && sep != '-' {
		return "", fmt.Errorf("hardware address %q: octets must be separated by ':' or '-'", s)
	}
	var b [6]byte
	for i := range 6 {
		o := s[i*3 : i*3+2]
		if i < 5 && s[i*3+2] != sep {
			return "", fmt.Errorf("hardware address %q: mixed or missing separators", s)
		}
		hi, ok1 := hexVal(o[0])
		lo, ok2 := hexVal(o[1])
		if !ok1 || !ok2 {
			return "", fmt.Errorf("hardware address %q: %q is not a hex octet", s, o)
		}
		b[i] = hi<<4 | lo
	}
	if b == ([6]byte{}) {
		return "", fmt.Errorf("hardware address %q: all zeros is not a NIC's address", s)
	}
	if b[0]&1 != 0 {
		return "", fmt.Errorf("hardware address %q: a multicast address is not a NIC's address", s)
	}
	return Format(b[:]), nil
}

// Format writes a 6-byte hardware address in the normal form.
func Format(hw []byte) string {
	const hexd = "0123456789abcdef"
	var sb strings.Builder
	for i, c := range hw {
		if i > 0 {
			sb.WriteByte(':')
		}
		sb.WriteByte(hexd[c>>4])
		sb.WriteByte(hexd[c&15])
	}
	return sb.String()
}

// BootIF is the pxelinux/dracut spelling of an address on the kernel
// command line: "01-" (the ARP type of Ethernet) and dash-separated octets.
func BootIF(normal string) string {
	return "01-" + strings.ReplaceAll(normal, ":", "-")
}

func hexVal(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// clip keeps an error message short whatever a client sent.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}
