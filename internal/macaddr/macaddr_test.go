package macaddr

import "testing"

func TestNormalize(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{"52:54:00:12:34:56", "52:54:00:12:34:56", true},
		{"52:54:00:AB:cd:EF", "52:54:00:ab:cd:ef", true},
		{"52-54-00-12-34-56", "52:54:00:12:34:56", true},
		{"52:54:00-12:34:56", "", false},
		{"52:54:00:12:34", "", false},
		{"52:54:00:12:34:56:78", "", false},
		{"5254.0012.3456", "", false},
		{"525400123456", "", false},
		{" 52:54:00:12:34:56", "", false},
		{"52:54:00:12:34:5g", "", false},
		{"00:00:00:00:00:00", "", false},
		{"01:00:5e:00:00:01", "", false},
		{"ff:ff:ff:ff:ff:ff", "", false},
		{"", "", false},
		{"52:54:00:12:34:+6", "", false},
	}
	for _, tc := range tests {
		got, err := Normalize(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("Normalize(%q) = %q, %v; want %q ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestBootIF(t *testing.T) {
	if got := BootIF("52:54:00:12:34:56"); got != "01-52-54-00-12-34-56" {
		t.Fatalf("BootIF = %q", got)
	}
}

func FuzzNormalize(f *testing.F) {
	f.Add("52:54:00:12:34:56")
	f.Add("52-54-00-12-34-56")
	f.Fuzz(func(t *testing.T, s string) {
		n, err := Normalize(s)
		if err != nil {
			return
		}
		again, err := Normalize(n)
		if err != nil || again != n {
			t.Fatalf("Normalize not idempotent: %q -> %q -> %q, %v", s, n, again, err)
		}
	})
}
