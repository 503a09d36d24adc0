package identity

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/internal/seediso"
)

const testURL = "https://10.0.2.2:7443"

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fwcfg lays out a fake sysfs fw_cfg directory with the given entries.
func fwcfg(t *testing.T, entries map[string]string) string {
	dir := filepath.Join(t.TempDir(), "opt", "tether")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, v := range entries {
		writeFile(t, filepath.Join(dir, name, "raw"), v)
	}
	return dir
}

// stub is a Source with canned answers that counts its calls.
type stub struct {
	name    string
	found   Found
	present bool
	err     error
	calls   int
}

func (s *stub) Name() string { return s.name }
func (s *stub) Lookup(context.Context) (Found, bool, error) {
	s.calls++
	return s.found, s.present, s.err
}

func TestDiscoverOrderAndPrecedence(t *testing.T) {
	all := Fields{URL: testURL, Token: testToken, CA: testCA}
	other := Fields{URL: "https://other:1", Token: "tbt_BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB", CA: "sha256:" + strings.Repeat("cd", 32)}
	tests := []struct {
		name     string
		explicit Fields
		sources  []*stub
		want     Fields
		wantFrom map[string]string
		calls    []int
	}{
		{
			name:     "first complete source wins, later ones are not consulted",
			sources:  []*stub{{name: "cmdline", found: Found{Fields: all}, present: true}, {name: "fwcfg", found: Found{Fields: other}, present: true}},
			want:     all,
			wantFrom: map[string]string{"url": "cmdline", "token": "cmdline", "ca": "cmdline"},
			calls:    []int{1, 0},
		},
		{
			name:     "absent source is skipped",
			sources:  []*stub{{name: "cmdline"}, {name: "fwcfg", found: Found{Fields: all}, present: true}},
			want:     all,
			wantFrom: map[string]string{"url": "fwcfg", "token": "fwcfg", "ca": "fwcfg"},
			calls:    []int{1, 1},
		},
		{
			name: "fields merge across sources in order",
			sources: []*stub{
				{name: "cmdline", found: Found{Fields: Fields{URL: testURL, CA: testCA}}, present: true},
				{name: "fwcfg", found: Found{Fields: Fields{URL: other.URL, Token: testToken}}, present: true},
				{name: "iso", found: Found{Fields: other}, present: true},
			},
			want:     all,
			wantFrom: map[string]string{"url": "cmdline", "token": "fwcfg", "ca": "cmdline"},
			calls:    []int{1, 1, 0},
		},
		{
			name:     "explicit flags win over every source",
			explicit: Fields{Token: other.Token},
			sources:  []*stub{{name: "cmdline", found: Found{Fields: all}, present: true}},
			want:     Fields{URL: testURL, Token: other.Token, CA: testCA},
			wantFrom: map[string]string{"url": "cmdline", "token": "flag", "ca": "cmdline"},
			calls:    []int{1},
		},
		{
			name:     "complete flags consult nothing",
			explicit: all,
			sources:  []*stub{{name: "cmdline", err: errors.New("must not be read")}},
			want:     all,
			wantFrom: map[string]string{"url": "flag", "token": "flag", "ca": "flag"},
			calls:    []int{0},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var srcs []Source
			for _, s := range tt.sources {
				srcs = append(srcs, s)
			}
			d, err := Discover(context.Background(), tt.explicit, srcs...)
			if err != nil {
				t.Fatal(err)
			}
			if d.Fields != tt.want {
				t.Errorf("fields = %v, want %v", d.Fields, tt.want)
			}
			for k, v := range tt.wantFrom {
				if d.From[k] != v {
					t.Errorf("From[%s] = %q, want %q", k, d.From[k], v)
				}
			}
			for i, s := range tt.sources {
				if s.calls != tt.calls[i] {
					t.Errorf("source %s consulted %d times, want %d", s.name, s.calls, tt.calls[i])
				}
			}
		})
	}
}

func TestDiscoverSourceErrorStops(t *testing.T) {
	later := &stub{name: "fwcfg", found: Found{Fields: Fields{URL: testURL, Token: testToken, CA: testCA}}, present: true}
	_, err := Discover(context.Background(), Fields{}, &stub{name: "kernel command line", err: errors.New("boom")}, later)
	if err == nil || !strings.Contains(err.Error(), "kernel command line: boom") {
		t.Fatalf("err = %v, want the failing source named", err)
	}
	if later.calls != 0 {
		t.Fatal("a later source was consulted after a broken one")
	}
}

func TestDiscoverBadFlag(t *testing.T) {
	_, err := Discover(context.Background(), Fields{CA: "nothex"})
	if err == nil || !strings.Contains(err.Error(), "--ca-sha256") {
		t.Fatalf("err = %v, want it to name --ca-sha256", err)
	}
}

func TestRequire(t *testing.T) {
	d, err := Discover(context.Background(), Fields{}, &stub{name: "kernel command line", found: Found{Fields: Fields{URL: testURL}}, present: true}, &stub{name: "QEMU fw_cfg"})
	if err != nil {
		t.Fatal(err)
	}
	err = d.Require(true)
	if !errors.Is(err, ErrIncomplete) {
		t.Fatalf("Require = %v, want ErrIncomplete", err)
	}
	for _, want := range []string{"bootstrap token", "CA fingerprint", "kernel command line: url", "QEMU fw_cfg: not present", "tetherctl token create"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Require error %q does not mention %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "control plane URL") {
		t.Errorf("Require error %q reports the URL missing although it was found", err)
	}
	d.CA = testCA
	if err := d.Require(false); err != nil {
		t.Errorf("Require(needToken=false) = %v, want nil", err)
	}
}

func TestCmdlineSource(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	writeFile(t, good, "BOOT_IMAGE=/vmlinuz tether.url="+testURL+" tether.token="+testToken+" tether.ca="+testCA+" tether.new=1\n")
	bad := filepath.Join(dir, "bad")
	writeFile(t, bad, "tether.url="+testURL+" tether.ca=sha256:zz\n")

	f, present, err := CmdlineSource{Path: good}.Lookup(context.Background())
	if err != nil || !present || f.Fields != (Fields{URL: testURL, Token: testToken, CA: testCA}) {
		t.Fatalf("good: %v %v %v", f, present, err)
	}
	if len(f.Warnings) != 1 || !strings.Contains(f.Warnings[0], "tether.new") {
		t.Errorf("warnings = %v, want one about tether.new", f.Warnings)
	}
	if _, _, err := (CmdlineSource{Path: bad}).Lookup(context.Background()); err == nil || !strings.Contains(err.Error(), "parameter tether.ca") {
		t.Fatalf("bad: err = %v, want it to name tether.ca", err)
	}
	if _, present, err := (CmdlineSource{Path: filepath.Join(dir, "none")}).Lookup(context.Background()); present || err != nil {
		t.Fatalf("missing file: present=%v err=%v, want absent", present, err)
	}
}

func TestFwCfgSource(t *testing.T) {
	t.Run("all entries", func(t *testing.T) {
		dir := fwcfg(t, map[string]string{"url": testURL, "token": testToken, "ca": testCA})
		f, present, err := FwCfgSource{Dir: dir}.Lookup(context.Background())
		if err != nil || !present || f.Fields != (Fields{URL: testURL, Token: testToken, CA: testCA}) {
			t.Fatalf("got %v %v %v", f, present, err)
		}
	})
	t.Run("partial", func(t *testing.T) {
		dir := fwcfg(t, map[string]string{"token": testToken})
		f, present, err := FwCfgSource{Dir: dir}.Lookup(context.Background())
		if err != nil || !present || f.Fields != (Fields{Token: testToken}) {
			t.Fatalf("got %v %v %v", f, present, err)
		}
	})
	t.Run("missing dir is not this source", func(t *testing.T) {
		_, present, err := FwCfgSource{Dir: filepath.Join(t.TempDir(), "nope")}.Lookup(context.Background())
		if present || err != nil {
			t.Fatalf("present=%v err=%v", present, err)
		}
	})
	t.Run("unreadable entry names the path", func(t *testing.T) {
		dir := fwcfg(t, map[string]string{"url": testURL})
		// A directory where the raw file should be cannot be read.
		if err := os.MkdirAll(filepath.Join(dir, "token", "raw"), 0o755); err != nil {
			t.Fatal(err)
		}
		_, _, err := FwCfgSource{Dir: dir}.Lookup(context.Background())
		if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "token", "raw")) {
			t.Fatalf("err = %v, want it to name the token entry's path", err)
		}
	})
	t.Run("bad value names the path", func(t *testing.T) {
		dir := fwcfg(t, map[string]string{"ca": "sha1:abc"})
		_, _, err := FwCfgSource{Dir: dir}.Lookup(context.Background())
		if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "ca", "raw")) {
			t.Fatalf("err = %v, want it to name the ca entry's path", err)
		}
	})
}

func TestSeedISOSource(t *testing.T) {
	dir := t.TempDir()
	// Devices are scanned in pattern order: a non-ISO disk, then the seed.
	writeFile(t, filepath.Join(dir, "vda"), strings.Repeat("\x00", 64<<10))
	seed := filepath.Join(dir, "vdb")
	if err := seediso.Write(seed, seediso.Material{URL: testURL, Token: testToken, CA: testCA}); err != nil {
		t.Fatal(err)
	}
	f, present, err := SeedISOSource{Devices: []string{filepath.Join(dir, "sr*"), filepath.Join(dir, "vd*")}}.Lookup(context.Background())
	if err != nil || !present || f.Fields != (Fields{URL: testURL, Token: testToken, CA: testCA}) {
		t.Fatalf("got %v %v %v", f, present, err)
	}

	t.Run("no seed anywhere", func(t *testing.T) {
		_, present, err := SeedISOSource{Devices: []string{filepath.Join(dir, "vda")}}.Lookup(context.Background())
		if present || err != nil {
			t.Fatalf("present=%v err=%v", present, err)
		}
	})
	t.Run("labelled but broken is an error naming the device", func(t *testing.T) {
		read := func(string) (seediso.Material, error) {
			return seediso.Material{}, errors.New("seed ISO is missing tether/ca")
		}
		_, _, err := SeedISOSource{Devices: []string{seed}, Read: read}.Lookup(context.Background())
		if err == nil || !strings.Contains(err.Error(), seed) || !strings.Contains(err.Error(), "tether/ca") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("bad value names device and file", func(t *testing.T) {
		read := func(string) (seediso.Material, error) {
			return seediso.Material{URL: "ftp://x", Token: testToken, CA: testCA}, nil
		}
		_, _, err := SeedISOSource{Devices: []string{seed}, Read: read}.Lookup(context.Background())
		if err == nil || !strings.Contains(err.Error(), seed+": tether/url") {
			t.Fatalf("err = %v", err)
		}
	})
}
