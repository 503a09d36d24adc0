package handover

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// root builds a tree from name -> content; a content starting with "->"
// is a symlink to the rest.
func root(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		if target, ok := strings.CutPrefix(content, "->"); ok {
			err = os.Symlink(target, p)
		} else {
			err = os.WriteFile(p, []byte(content), 0o755)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestDetect(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  Init
	}{
		// Debian: /sbin/init -> /lib/systemd/systemd, and /lib -> usr/lib.
		{"debian systemd, absolute link through a merged /usr", map[string]string{
			"usr/lib/systemd/systemd": "elf", "lib": "->usr/lib", "sbin/init": "->/lib/systemd/systemd"},
			Init{Kind: Systemd, Path: "/lib/systemd/systemd"}},
		{"relative link", map[string]string{"lib/systemd/systemd": "elf", "sbin/init": "->../lib/systemd/systemd"},
			Init{Kind: Systemd, Path: "/lib/systemd/systemd"}},
		{"busybox with the documented hook", map[string]string{"bin/busybox": "elf", "sbin/init": "->../bin/busybox",
			"etc/inittab": "::respawn:/usr/libexec/tether/run-agent\n"}, Init{Kind: Other, Path: "/bin/busybox", Hook: true}},
		{"sysvinit without a hook", map[string]string{"sbin/init": "elf", "etc/inittab": "id:2:initdefault:\n"},
			Init{Kind: Other, Path: "/sbin/init"}},
		{"no init", map[string]string{"etc/os-release": "x"}, Init{Kind: None, Path: "/sbin/init"}},
		// The link must be read inside the root, never followed on the
		// host: a dangling link inside the root is no init.
		{"dangling link", map[string]string{"sbin/init": "->/nowhere/init"}, Init{Kind: None, Path: "/nowhere/init"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Detect(root(t, tc.files))
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("Detect = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestDetectLinkLoop(t *testing.T) {
	dir := root(t, map[string]string{"sbin/init": "->/sbin/init2", "sbin/init2": "->/sbin/init"})
	if _, err := Detect(dir); err == nil || !strings.Contains(err.Error(), "symlinks") {
		t.Fatalf("a symlink loop: err = %v, want one naming the symlinks", err)
	}
}

func TestWriteSystemd(t *testing.T) {
	run := t.TempDir()
	u := Unit{Agent: "/run/tether/bin/tether-agent", StateDir: "/run/tether"}
	// Twice: a second switch in one boot (a failed one retried) replaces both.
	for range 2 {
		file, err := WriteSystemd(run, u)
		if err != nil {
			t.Fatal(err)
		}
		if file != filepath.Join(run, "systemd/system/tether-agent.service") {
			t.Fatalf("unit at %s", file)
		}
	}
	b, err := os.ReadFile(filepath.Join(run, "systemd/system/tether-agent.service"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"ExecStart=/run/tether/bin/tether-agent --root-mode=none --state-dir=/run/tether\n",
		"Restart=always\n", "DefaultDependencies=no\n", "Before=sysinit.target shutdown.target\n", "Conflicts=shutdown.target\n", "StandardOutput=journal+console\n", "StartLimitIntervalSec=0\n",
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("unit lacks %q:\n%s", want, b)
		}
	}
	link := filepath.Join(run, "systemd/system/sysinit.target.wants/tether-agent.service")
	if got, err := os.Readlink(link); err != nil || got != "../tether-agent.service" {
		t.Fatalf("wants link = %q, %v", got, err)
	}
	if _, err := os.Stat(link); err != nil {
		t.Fatalf("wants link does not resolve: %v", err)
	}
}

func TestWriteSystemdRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T) string
		u    Unit
		want string
	}{
		{"relative agent", func(t *testing.T) string { return t.TempDir() }, Unit{Agent: "tether-agent", StateDir: "/run/tether"}, "absolute"},
		{"run is a file", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "run")
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			return p
		}, Unit{Agent: "/a", StateDir: "/s"}, "not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := WriteSystemd(tc.run(t), tc.u); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestAdvice(t *testing.T) {
	got := Advice(Init{Kind: Other, Path: "/bin/busybox"}, "/run/tether/bin/tether-agent", "/run/tether")
	for _, want := range []string{"/bin/busybox", "--root-mode=none --state-dir=/run/tether", "examples/root", "switch timeout"} {
		if !strings.Contains(got, want) {
			t.Errorf("advice %q lacks %q", got, want)
		}
	}
}
