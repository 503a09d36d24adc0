// Package handover prepares a composed root for the exec of its init, so
// that the agent comes back after it (docs/design.md §2.3). A stock
// systemd root carries no file of Tether's: the agent writes a runtime unit
// for itself under /run/systemd/system, which systemd reads at start-up, and
// /run (with the agent's binary, key, certificate and state under
// /run/tether) is moved into the new root by the switch. Any other init
// must start the agent itself; the console says so.
package handover

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// Kind is the family of the init a root hands over to.
type Kind int

const (
	// None: the root has no /sbin/init; the agent stays its supervisor.
	None Kind = iota
	// Systemd: /sbin/init is systemd, which reads runtime units from /run.
	Systemd
	// Other: busybox, OpenRC, sysvinit...; the root must start the agent.
	Other
)

func (k Kind) String() string {
	switch k {
	case Systemd:
		return "systemd"
	case Other:
		return "other"
	}
	return "none"
}

// Init says what a root's init is.
type Init struct {
	Kind Kind
	// Path is the init the symlinks lead to, as seen inside the root
	// (e.g. /lib/systemd/systemd).
	Path string
	// Hook is set for Other when the root's /etc/inittab starts the
	// agent (the documented hook, examples/root's respawn line).
	Hook bool
}

// maxLinks bounds the symlink chain from /sbin/init (a loop is a broken root).
const maxLinks = 16

// Detect reads what /sbin/init is in the root at dir. Symlinks are
// resolved inside the root: an absolute link target means the root's own
// path, not the initramfs's. A root whose init is not there reads None.
func Detect(dir string) (Init, error) {
	p := "/sbin/init"
	for i := 0; ; i++ {
		if i == maxLinks {
			return Init{}, fmt.Errorf("handover: /sbin/init in %s: more than %d symlinks", dir, maxLinks)
		}
		fi, err := os.Lstat(filepath.Join(dir, p))
		if errors.Is(err, fs.ErrNotExist) {
			return Init{Kind: None, Path: p}, nil
		}
		if err != nil {
			return Init{}, fmt.Errorf("handover: %w", err)
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			break
		}
		t, err := os.Readlink(filepath.Join(dir, p))
		if err != nil {
			return Init{}, fmt.Errorf("handover: %w", err)
		}
		if !path.IsAbs(t) {
			t = path.Join(path.Dir(p), t)
		}
		p = path.Clean(t)
	}
	if path.Base(p) == "systemd" {
		return Init{Kind: Systemd, Path: p}, nil
	}
	in := Init{Kind: Other, Path: p}
	if b, err := os.ReadFile(filepath.Join(dir, "etc/inittab")); err == nil && strings.Contains(string(b), "tether") {
		in.Hook = true
	}
	return in, nil
}

// Unit is the agent's runtime unit.
type Unit struct {
	// Name is the unit file's name (default tether-agent.service).
	Name string
	// Agent is the agent binary as seen from the new root.
	Agent string
	// StateDir is the agent's state directory as seen from the new root.
	StateDir string
}

// DefaultUnitName is the unit the agent writes for itself.
const DefaultUnitName = "tether-agent.service"

// wantedBy is the target whose .wants link starts the agent. sysinit.target
// is the earliest target every normal boot reaches (multi-user.target would
// wait for the whole boot); the unit orders itself before it, so at shutdown
// it is stopped after every ordinary service, which all run after
// sysinit.target, and its last heartbeat goes out while the network is up.
const wantedBy = "sysinit.target"

// Text is the unit file.
//
// Type=exec: the start is done once the binary runs, so the boot does not
// wait for the control plane (Type=notify would hold sysinit.target until
// the agent reported ready, and a control plane that is down would stall
// the boot). DefaultDependencies=no: it must not wait for basic.target,
// which is after sysinit.target, which it orders itself before.
// Conflicts/Before=shutdown.target: a poweroff stops it (SIGTERM, and the
// agent closes its stream) before the final kill of every process.
// Restart=always with a pause: a crashed agent comes back, and a crash loop
// does not spin; StartLimitIntervalSec=0, so systemd never stops trying (its
// default, 5 starts in 10 s, would leave a node whose control plane is down
// for a minute without an agent for good). journal+console: the agent's lines are the operator's
// view of the node (tetherctl instance console), as they were before the
// switch.
func (u Unit) Text() string {
	return fmt.Sprintf(`# Written by tether-agent before it handed the node to this root's systemd.
# It lives in /run: nothing of Tether's is in the root's image.
[Unit]
Description=Tether node agent
Documentation=https://github.com/tetherfleet/tether/blob/main/docs/operator-guide.md
DefaultDependencies=no
Before=%[3]s shutdown.target
Conflicts=shutdown.target
StartLimitIntervalSec=0

[Service]
Type=exec
ExecStart=%[1]s --root-mode=none --state-dir=%[2]s
Restart=always
RestartSec=2
TimeoutStopSec=15
KillMode=mixed
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=%[3]s
`, u.Agent, u.StateDir, wantedBy)
}

// WriteSystemd writes the unit and its wants link under runDir (the /run
// that the switch moves into the new root): runDir/systemd/system/NAME and
// runDir/systemd/system/sysinit.target.wants/NAME -> ../NAME. It returns
// the unit file's path.
func WriteSystemd(runDir string, u Unit) (string, error) {
	if u.Name == "" {
		u.Name = DefaultUnitName
	}
	if !path.IsAbs(u.Agent) || !path.IsAbs(u.StateDir) {
		return "", fmt.Errorf("handover: unit paths must be absolute (agent %q, state dir %q)", u.Agent, u.StateDir)
	}
	dir := filepath.Join(runDir, "systemd", "system")
	wants := filepath.Join(dir, wantedBy+".wants")
	if err := os.MkdirAll(wants, 0o755); err != nil {
		return "", fmt.Errorf("handover: %w", err)
	}
	file := filepath.Join(dir, u.Name)
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, []byte(u.Text()), 0o644); err != nil {
		return "", fmt.Errorf("handover: write unit: %w", err)
	}
	if err := os.Rename(tmp, file); err != nil {
		return "", fmt.Errorf("handover: write unit: %w", err)
	}
	link := filepath.Join(wants, u.Name)
	if err := os.Remove(link); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("handover: replace wants link: %w", err)
	}
	if err := os.Symlink(path.Join("..", u.Name), link); err != nil {
		return "", fmt.Errorf("handover: wants link: %w", err)
	}
	return file, nil
}

// Advice is the one console line for a root whose init is not systemd.
func Advice(in Init, agent, stateDir string) string {
	cmd := fmt.Sprintf("%s --root-mode=none --state-dir=%s", agent, stateDir)
	if in.Hook {
		return fmt.Sprintf("the root's init is %s (not systemd); its /etc/inittab names tether, and must start and restart `%s`", in.Path, cmd)
	}
	return fmt.Sprintf("the root's init is %s (not systemd): the root must start and restart `%s` itself "+
		"(examples/root does it with a respawn line in /etc/inittab), or the instance errors after the control plane's switch timeout", in.Path, cmd)
}
