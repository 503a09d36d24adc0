package seediso

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParse checks that no file content makes Parse panic and that what it
// accepts is what Write would write back.
func FuzzParse(f *testing.F) {
	f.Add([]byte("https://cp:7443\n"), []byte("tbt_x"), []byte("sha256:ab"))
	f.Add([]byte(""), []byte("\x00"), []byte(" \t"))
	f.Fuzz(func(t *testing.T, url, token, ca []byte) {
		m, err := Parse(map[string][]byte{FileURL: url, FileToken: token, FileCA: ca})
		if err != nil {
			return
		}
		if err := m.validate(); err != nil {
			t.Fatalf("Parse accepted %+v that Write refuses: %v", m, err)
		}
		for _, v := range []string{m.URL, m.Token, m.CA} {
			if strings.ContainsAny(v, " \t\r\n\x00") {
				t.Fatalf("Parse let whitespace or NUL through: %q", v)
			}
		}
	})
}

// FuzzRead feeds arbitrary images to the reader: a seed ISO comes from a
// disk anyone can attach, and the agent reading it is PID 1.
func FuzzRead(f *testing.F) {
	seed := filepath.Join(f.TempDir(), "seed.iso")
	if err := Write(seed, goodMaterial); err != nil {
		f.Fatal(err)
	}
	good, err := os.ReadFile(seed)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:40000])
	f.Add([]byte("CD001"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, image []byte) {
		p := filepath.Join(dir, "img")
		if err := os.WriteFile(p, image, 0o600); err != nil {
			t.Fatal(err)
		}
		m, err := Read(p)
		if err == nil {
			if err := m.validate(); err != nil {
				t.Fatalf("Read returned invalid material %+v: %v", m, err)
			}
		}
	})
}
