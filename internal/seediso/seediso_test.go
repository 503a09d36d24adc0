package seediso

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var goodMaterial = Material{
	URL:   "https://10.0.2.2:7443",
	Token: "tbt_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
	CA:    "sha256:" + strings.Repeat("ab", 32),
}

func TestWriteReadRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seed.iso")
	if err := Write(path, goodMaterial); err != nil {
		t.Fatalf("Write: %v", err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("image mode = %v, %v; want 0600 (it holds a token)", st.Mode().Perm(), err)
	}
	got, err := Read(path)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	if got != goodMaterial {
		t.Fatalf("Read = %+v, want %+v", got, goodMaterial)
	}
	// Writing again replaces the image in place.
	m2 := goodMaterial
	m2.Token = "tbt_other"
	if err := Write(path, m2); err != nil {
		t.Fatalf("second Write: %v", err)
	}
	if got, err := Read(path); err != nil || got != m2 {
		t.Fatalf("Read after rewrite = %+v, %v; want %+v", got, err, m2)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("Write left %d files behind, want only the image", len(entries))
	}
}

func TestWriteRefusesBadMaterial(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Material)
		want string
	}{
		{"empty url", func(m *Material) { m.URL = "" }, "tether/url is empty"},
		{"token with newline", func(m *Material) { m.Token = "a\nb" }, "tether/token"},
		{"ca with space", func(m *Material) { m.CA = "sha256: ab" }, "tether/ca"},
		{"trailing space", func(m *Material) { m.Token = "abc " }, "token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := goodMaterial
			tt.mod(&m)
			err := Write(filepath.Join(t.TempDir(), "seed.iso"), m)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Write error = %v, want it to mention %q", err, tt.want)
			}
		})
	}
}

func TestReadNotSeed(t *testing.T) {
	dir := t.TempDir()
	zeros := filepath.Join(dir, "zeros.img")
	if err := os.WriteFile(zeros, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	short := filepath.Join(dir, "short.img")
	if err := os.WriteFile(short, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{zeros, short} {
		if _, err := Read(p); !errors.Is(err, ErrNotSeed) {
			t.Errorf("Read(%s) error = %v, want ErrNotSeed", filepath.Base(p), err)
		}
	}
	if _, err := Read(filepath.Join(dir, "missing")); err == nil || errors.Is(err, ErrNotSeed) {
		t.Errorf("Read(missing) error = %v, want a plain open error", err)
	}
}

func TestParse(t *testing.T) {
	full := map[string][]byte{
		"url":   []byte("https://cp:7443\n"),
		"token": []byte("tbt_x"),
		"ca":    []byte("sha256:ab\r\n"),
	}
	tests := []struct {
		name    string
		files   map[string][]byte
		want    Material
		wantErr string
	}{
		{"trailing whitespace trimmed", full, Material{URL: "https://cp:7443", Token: "tbt_x", CA: "sha256:ab"}, ""},
		{"missing token", map[string][]byte{"url": []byte("u"), "ca": []byte("c")}, Material{}, "missing tether/token"},
		{"nul inside", map[string][]byte{"url": []byte("u\x00v"), "token": []byte("t"), "ca": []byte("c")}, Material{}, "tether/url: byte 1"},
		{"too big", map[string][]byte{"url": make([]byte, MaxFieldBytes+1), "token": []byte("t"), "ca": []byte("c")}, Material{}, "larger than"},
		{"only whitespace", map[string][]byte{"url": []byte(" \n"), "token": []byte("t"), "ca": []byte("c")}, Material{}, "tether/url is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.files)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Parse = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestNormaliseName(t *testing.T) {
	for in, want := range map[string]string{"URL.;1": "url", "token": "token", "CA;1": "ca", "Ca.": "ca"} {
		if got := NormaliseName(in); got != want {
			t.Errorf("NormaliseName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestTrimLabel(t *testing.T) {
	for in, want := range map[string]string{"TETHERSEED\x00\x00\x00": "TETHERSEED", "TETHERSEED   ": "TETHERSEED", "X": "X"} {
		if got := TrimLabel(in); got != want {
			t.Errorf("TrimLabel(%q) = %q, want %q", in, got, want)
		}
	}
}
