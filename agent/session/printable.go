package session

import "strings"

// printable makes free text fit what the control plane accepts from a
// node: control characters (line breaks of a wrapped error among them)
// become spaces and the text is cut at max bytes on a character boundary.
// The control plane refuses a report that breaks these rules, so sending
// one unchanged would lose the whole heartbeat or task result.
func printable(s string, max int) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f) || r == 0x2028 || r == 0x2029 {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

func utf8RuneStart(b byte) bool { return b&0xc0 != 0x80 }
