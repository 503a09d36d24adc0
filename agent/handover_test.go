package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/agent/identity"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// TestSwitchPreparesTheHandover: before the exec, a systemd root gets the
// agent's runtime unit on the /run that moves into it, and another init
// gets a console line saying what the root must do.
func TestSwitchPreparesTheHandover(t *testing.T) {
	for _, tc := range []struct {
		name     string
		init     map[string]string // path in the root -> symlink target ("" : a file)
		wantUnit bool
		console  string
	}{
		{"systemd", map[string]string{"lib/systemd/systemd": "", "sbin/init": "/lib/systemd/systemd"}, true,
			"the root's init is systemd (/lib/systemd/systemd): it starts the next agent from "},
		{"busybox", map[string]string{"bin/busybox": "", "sbin/init": "../bin/busybox"}, false,
			"the root's init is /bin/busybox (not systemd): the root must start and restart"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target, run, state := t.TempDir(), t.TempDir(), t.TempDir()
			for p, link := range tc.init {
				full := filepath.Join(target, p)
				if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
					t.Fatal(err)
				}
				var err error
				if link == "" {
					err = os.WriteFile(full, nil, 0o755)
				} else {
					err = os.Symlink(link, full)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			cp := newControlPlane(t)
			cp.assign(t, 1, 0)
			root := &fakeRoot{switched: make(chan struct{}), release: make(chan struct{})}
			r := start(t, Config{StateDir: state, RunDir: run, Sources: []identity.Source{cmdline(t, cp.URL, cp.AddToken("i-1"), cp.ca.Fingerprint)},
				RootMode: RootModeSwitch, Root: root, RootTarget: target})
			t.Cleanup(func() { r.cancel(); close(root.release) })
			select {
			case <-root.switched:
			case <-time.After(20 * time.Second):
				t.Fatal("the agent never switched root")
			}
			unit := filepath.Join(run, "systemd/system/tether-agent.service")
			b, err := os.ReadFile(unit)
			if tc.wantUnit != (err == nil) {
				t.Fatalf("unit written = %v, want %v (%v)", err == nil, tc.wantUnit, err)
			}
			if tc.wantUnit && !strings.Contains(string(b), "ExecStart="+filepath.Join(state, "bin/tether-agent")+" --root-mode=none --state-dir="+state+"\n") {
				t.Fatalf("unit does not start the agent from its state directory:\n%s", b)
			}
			if out := r.console.String(); !strings.Contains(out, tc.console) {
				t.Fatalf("console lacks %q:\n%s", tc.console, out)
			}
		})
	}
}

// TestSwitchRefusesModulesTooBigForMemory: before anything is fetched, a
// node whose memory cannot hold its root gives up with the sizes named,
// and the control plane sees why, marked as a boot that retrying cannot
// fix (boot_failed).
func TestSwitchRefusesModulesTooBigForMemory(t *testing.T) {
	meminfo := filepath.Join(t.TempDir(), "meminfo")
	// 1 MiB available: less than the margin alone.
	if err := os.WriteFile(meminfo, []byte("MemTotal: 65536 kB\nMemAvailable: 1024 kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cp := newControlPlane(t)
	cp.assign(t, 1, 0)
	root := &fakeRoot{switched: make(chan struct{}), release: make(chan struct{})}
	r := start(t, Config{StateDir: t.TempDir(), MemInfo: meminfo, Sources: []identity.Source{cmdline(t, cp.URL, cp.AddToken("i-1"), cp.ca.Fingerprint)},
		RootMode: RootModeSwitch, Root: root})
	err := r.wait(t)
	if err == nil || !strings.Contains(err.Error(), "only 1.0 MiB of the node's 64.0 MiB is available") {
		t.Fatalf("Run = %v, want the memory sizes named", err)
	}
	s := cp.stream(t)
	s.waitFor(t, "the memory error", func(m *tetherv1.AgentMessage) bool {
		return strings.Contains(m.GetHeartbeat().GetError(), "cannot hold its modules") && m.GetHeartbeat().GetBootFailed()
	})
	cp.Lock()
	defer cp.Unlock()
	if len(cp.FetchOffsets) != 0 {
		t.Fatal("modules were fetched although they cannot fit")
	}
}
