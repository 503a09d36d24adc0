package memcheck

import (
	"strings"
	"testing"
)

const meminfo = `MemTotal:         503424 kB
MemFree:          401000 kB
MemAvailable:     450560 kB
Buffers:               0 kB
`

func TestParse(t *testing.T) {
	in, err := Parse([]byte(meminfo))
	if err != nil {
		t.Fatal(err)
	}
	if in.Total != 503424<<10 || in.Available != 450560<<10 {
		t.Fatalf("Parse = %+v", in)
	}
	for _, tc := range []struct{ name, text, want string }{
		{"no MemAvailable", "MemTotal: 1 kB\n", "lacks"},
		{"not kB", "MemTotal: 1 MB\nMemAvailable: 1 kB\n", "want"},
		{"not a number", "MemTotal: x kB\nMemAvailable: 1 kB\n", "MemTotal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Parse([]byte(tc.text)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	in := Info{Total: 512 << 20, Available: 440 << 20}
	for _, tc := range []struct {
		name string
		need Need
		want []string // empty: fits
	}{
		{"a Debian root fits 512 MiB", Need{Root: 107 << 20, Margin: DefaultMargin}, nil},
		{"exactly what is available", Need{Root: 312 << 20, Margin: 128 << 20}, nil},
		{"one byte more", Need{Root: 312<<20 + 1, Margin: 128 << 20}, []string{"root layers 312.0 MiB", "= 440.0 MiB", "only 440.0 MiB of the node's 512.0 MiB"}},
		{"extensions count", Need{Root: 200 << 20, Extensions: 200 << 20, Margin: 128 << 20}, []string{"extensions 200.0 MiB", "margin 128.0 MiB", "= 528.0 MiB"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(in, tc.need)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("Check passed a node too small")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}
