package tasks

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"golang.org/x/sys/unix"
)

// Power reboots or powers off the machine.
type Power interface {
	// Check says whether the action can work, before success is reported.
	Check() error
	Reboot() error
	PowerOff() error
	// Describe is the task output for kind ("reboot", "poweroff").
	Describe(kind string) string
}

// SystemPower really does it: sync the filesystems, then reboot(2).
type SystemPower struct{}

func (SystemPower) Check() error {
	if os.Geteuid() != 0 {
		return errors.New("the agent is not running as root, so it cannot reboot or power off this machine")
	}
	return nil
}

func (SystemPower) Reboot() error {
	unix.Sync()
	return unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
}

func (SystemPower) PowerOff() error {
	unix.Sync()
	return unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}

func (SystemPower) Describe(kind string) string {
	if kind == "poweroff" {
		return "powering off"
	}
	return "rebooting"
}

// DryRunPower is for --root-mode=none without --allow-power: the agent is
// a guest on someone else's machine (a developer's laptop, a test) and must
// not take it down. It says what it would have done and succeeds.
type DryRunPower struct {
	Logf func(format string, args ...any)
}

func (DryRunPower) Check() error { return nil }

func (p DryRunPower) Reboot() error {
	p.log("would reboot now (--root-mode=none: not touching this host; pass --allow-power to really reboot)")
	return nil
}

func (p DryRunPower) PowerOff() error {
	p.log("would power off now (--root-mode=none: not touching this host; pass --allow-power to really power off)")
	return nil
}

func (DryRunPower) Describe(kind string) string {
	return "would " + map[string]string{"poweroff": "power off", "reboot": "reboot"}[kind] + " (dry run: --root-mode=none without --allow-power)"
}

func (p DryRunPower) log(msg string) {
	if p.Logf != nil {
		p.Logf("%s", msg)
	}
}

// SystemdPower asks the root's systemd to reboot or power off, so its
// services stop in order and its filesystems are unmounted: reboot(2)
// behind systemd's back would cut a running OS off mid-write. --no-block
// lets the task report success before systemd stops the agent itself.
type SystemdPower struct {
	// Run runs a command (default: exec it and return its combined output
	// in the error).
	Run func(name string, args ...string) error
}

func (p SystemdPower) Check() error { return SystemPower{}.Check() }

func (p SystemdPower) Reboot() error { return p.systemctl("reboot") }

func (p SystemdPower) PowerOff() error { return p.systemctl("poweroff") }

func (SystemdPower) Describe(kind string) string {
	if kind == "poweroff" {
		return "powering off through systemd (systemctl poweroff)"
	}
	return "rebooting through systemd (systemctl reboot)"
}

func (p SystemdPower) systemctl(verb string) error {
	run := p.Run
	if run == nil {
		run = func(name string, args ...string) error {
			out, err := exec.Command(name, args...).CombinedOutput()
			if err != nil {
				return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
			}
			return nil
		}
	}
	if err := run("systemctl", "--no-block", verb); err != nil {
		return fmt.Errorf("ask systemd to %s: %w", verb, err)
	}
	return nil
}
