package rootfs

import (
	"errors"
	"fmt"
	"io/fs"
	"reflect"
	"strings"
	"testing"
)

// initramfsFake is a fake in the state Switch expects: the pseudo
// filesystems mounted, a composed root at /newroot, / a tmpfs.
func initramfsFake() *fakeSys {
	f := newFakeSys()
	for _, m := range []string{"/dev", "/proc", "/sys", "/run", "/tmp", "/newroot"} {
		f.mountPts[m] = true
	}
	f.execs["/sbin/init"] = true
	return f
}

func TestSwitchOrderOfOperations(t *testing.T) {
	f := initramfsFake()
	err := Switch(f, "/newroot", SwitchOptions{AgentPath: "/init", InitArgs: []string{"--verbose"},
		BeforeExec: func() { f.calls = append(f.calls, "before exec") }})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		// Into the current /run, which then moves along.
		"bind /init /run/tether/bin/tether-agent",
		"mkdir /newroot/dev",
		"mount move /dev /newroot/dev ",
		"mkdir /newroot/proc",
		"mount move /proc /newroot/proc ",
		"mkdir /newroot/sys",
		"mount move /sys /newroot/sys ",
		"mkdir /newroot/run",
		"mount move /run /newroot/run ",
		"umount-lazy /tmp",
		"remove /",
		"chdir /newroot",
		"mount move /newroot / ",
		"chroot .",
		"chdir /",
		"before exec",
		"exec /sbin/init --verbose",
	}
	if !reflect.DeepEqual(f.calls, want) {
		t.Fatalf("calls:\n%s\nwant:\n%s", strings.Join(f.calls, "\n"), strings.Join(want, "\n"))
	}
}

func TestSwitchWithoutInitLeavesCallerAsSupervisor(t *testing.T) {
	f := initramfsFake()
	f.execs = map[string]bool{}
	err := Switch(f, "/newroot", SwitchOptions{BeforeExec: func() { t.Error("BeforeExec ran with no init to exec") }})
	if !errors.Is(err, ErrNoInit) {
		t.Fatalf("err = %v, want ErrNoInit", err)
	}
	if last := f.calls[len(f.calls)-1]; last != "chdir /" {
		t.Errorf("last call %q: the switch should be complete before reporting no init", last)
	}
	if !strings.Contains(err.Error(), "/sbin/init") {
		t.Errorf("error %q does not say which init was looked for", err)
	}
}

func TestSwitchTriesInitCandidatesInOrder(t *testing.T) {
	f := initramfsFake()
	f.execs = map[string]bool{"/bin/sh": true}
	if err := Switch(f, "/newroot", SwitchOptions{Init: []string{"/sbin/init", "/bin/sh"}}); err != nil {
		t.Fatal(err)
	}
	if last := f.calls[len(f.calls)-1]; last != "exec /bin/sh" {
		t.Fatalf("last call %q, want exec /bin/sh", last)
	}
}

func TestSwitchCopiesTheAgentWhenTheBindFails(t *testing.T) {
	f := initramfsFake()
	f.failOn = "bind "
	var logs []string
	err := Switch(f, "/newroot", SwitchOptions{AgentPath: "/init", Logf: func(format string, args ...any) { logs = append(logs, fmt.Sprintf(format, args...)) }})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"bind /init /run/tether/bin/tether-agent", "copy /init /run/tether/bin/tether-agent 755"}; !reflect.DeepEqual(f.calls[:2], want) {
		t.Fatalf("calls %q, want them to start %q", f.calls, want)
	}
	if !strings.Contains(strings.Join(logs, "\n"), "copying it instead") {
		t.Errorf("the fallback was not logged: %q", logs)
	}
}

func TestSwitchStopsWhenTheAgentCannotBePlaced(t *testing.T) {
	f := initramfsFake()
	f.failOn = "bind "
	f.calls = nil
	// Both the bind and the copy fail: nothing is moved.
	fail := &failBoth{fakeSys: f}
	err := Switch(fail, "/newroot", SwitchOptions{AgentPath: "/init"})
	if err == nil || !strings.Contains(err.Error(), "copy agent to /run/tether/bin/tether-agent") {
		t.Fatalf("err = %v", err)
	}
	for _, c := range f.calls {
		if strings.HasPrefix(c, "mount move") {
			t.Fatalf("moved mounts although the agent could not be placed: %q", f.calls)
		}
	}
}

// failBoth fails every copy as well as the first bind.
type failBoth struct{ *fakeSys }

func (f *failBoth) CopyFile(src, dst string, perm fs.FileMode) error {
	_ = f.record("copy %s %s %o", src, dst, perm)
	return errors.New("no space left on device")
}

func TestSwitchWithoutRunMountPutsTheAgentIntoTarget(t *testing.T) {
	f := initramfsFake()
	delete(f.mountPts, "/run")
	if err := Switch(f, "/newroot", SwitchOptions{AgentPath: "/init"}); err != nil {
		t.Fatal(err)
	}
	if f.calls[0] != "bind /init /newroot/run/tether/bin/tether-agent" {
		t.Fatalf("first call %q", f.calls[0])
	}
	for _, c := range f.calls {
		if strings.HasPrefix(c, "mount move /run") {
			t.Errorf("moved /run although it is not a mount point: %q", c)
		}
	}
}

// Failures that make the switch unsafe are caught before anything changes.
func TestSwitchRefuses(t *testing.T) {
	tests := []struct {
		name    string
		target  string
		setup   func(*fakeSys)
		wantErr string
	}{
		{"not an initramfs", "/newroot", func(f *fakeSys) { f.fsType = 0xEF53 }, "/ is not an initramfs (filesystem type 0xef53)"},
		{"target not mounted", "/newroot", func(f *fakeSys) { delete(f.mountPts, "/newroot") }, "not a mount point"},
		{"target under /run", "/run/newroot", func(f *fakeSys) { f.mountPts["/run/newroot"] = true }, "inside /run"},
		{"target is /", "/", func(*fakeSys) {}, "other than /"},
		{"relative target", "newroot", func(*fakeSys) {}, "clean absolute path"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := initramfsFake()
			tc.setup(f)
			err := Switch(f, tc.target, SwitchOptions{AgentPath: "/init"})
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
			}
			if len(f.calls) != 0 {
				t.Errorf("changed things before refusing: %q", f.calls)
			}
		})
	}
}

func TestSwitchStopsAtAFailedMove(t *testing.T) {
	f := initramfsFake()
	f.failOn = "mount move /sys"
	err := Switch(f, "/newroot", SwitchOptions{})
	if err == nil || !strings.Contains(err.Error(), "move /sys to /newroot/sys") {
		t.Fatalf("err = %v", err)
	}
	for _, c := range f.calls {
		if c == "remove /" || strings.HasPrefix(c, "chroot") {
			t.Fatalf("went on after a failed move: %q", f.calls)
		}
	}
}

func TestSwitchFreeingInitramfsIsNotFatal(t *testing.T) {
	f := initramfsFake()
	f.failOn = "remove /"
	var logs []string
	err := Switch(f, "/newroot", SwitchOptions{Logf: func(format string, args ...any) { logs = append(logs, format) }})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(logs, "\n"), "free initramfs") {
		t.Errorf("failure to free the initramfs was not logged: %q", logs)
	}
}
