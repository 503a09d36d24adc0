package agent

import (
	"context"
	"os"
	"path/filepath"

	"github.com/tetherfleet/tether/agent/handover"
	"github.com/tetherfleet/tether/agent/memcheck"
	"github.com/tetherfleet/tether/agent/powerbutton"
	"github.com/tetherfleet/tether/agent/tasks"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// agentBin is where the switch puts the agent's binary, under the state
// directory on /run, so that whatever the new root's init starts finds it
// beside its key, certificate and state.
func (c *Config) agentBin() string { return filepath.Join(c.StateDir, "bin", "tether-agent") }

// prepareHandover makes sure an agent comes back after the exec of the
// composed root's init (docs/design.md §2.3): for systemd it writes a
// runtime unit on the /run that moves into the new root; for another init
// it says in one console line what the root must do. Nothing here stops
// the switch: a root that does not bring the agent back is errored by the
// control plane's switch timeout, and the console says why.
func (a *agent) prepareHandover() {
	in, err := handover.Detect(a.cfg.RootTarget)
	if err != nil {
		a.con.Printf("cannot tell what init the root has (%v); the root must start `%s --root-mode=none --state-dir=%s` itself", err, a.cfg.agentBin(), a.cfg.StateDir)
		return
	}
	switch in.Kind {
	case handover.Systemd:
		file, err := handover.WriteSystemd(a.cfg.RunDir, handover.Unit{Agent: a.cfg.agentBin(), StateDir: a.cfg.StateDir})
		if err != nil {
			a.con.Printf("the root's init is systemd (%s), but writing the agent's unit failed: %v; the agent will not come back after the switch", in.Path, err)
			return
		}
		a.con.Printf("the root's init is systemd (%s): it starts the next agent from %s", in.Path, file)
	case handover.Other:
		a.con.Printf("%s", handover.Advice(in, a.cfg.agentBin(), a.cfg.StateDir))
	case handover.None:
		// Switch finds no init and this agent stays as the supervisor.
	}
}

// underSystemd says whether systemd runs this machine: its runtime
// directory exists (sd_booted(3)'s test).
func (c *Config) underSystemd() bool {
	fi, err := os.Stat(filepath.Join(c.RunDir, "systemd", "system"))
	return err == nil && fi.IsDir()
}

// watchPowerButton powers the node off when the ACPI power button is
// pressed: that is how QEMU's system_powerdown (tetherctl instance stop)
// and other providers' graceful stops reach a node. Under systemd the
// poweroff goes through systemctl, which stops this agent in turn.
func (a *agent) watchPowerButton(ctx context.Context, power tasks.Power) {
	err := powerbutton.Run(ctx, a.cfg.PowerButtons, "/dev/input", a.con.Printf, func() {
		if err := power.Check(); err != nil {
			a.con.Printf("power button pressed, but %v", err)
			return
		}
		a.con.Printf("power button pressed (ACPI): %s", power.Describe("poweroff"))
		if err := power.PowerOff(); err != nil {
			a.con.Printf("power off after the power button failed: %v", err)
		}
	})
	if err != nil && ctx.Err() == nil {
		a.con.Printf("the power button is not watched: %v", err)
	}
}

// checkMemory refuses, before anything is fetched, a boot whose modules the
// node's memory cannot hold: in switch mode every module file lives on the
// /run tmpfs and the root runs from them. The error names the sizes.
func (a *agent) checkMemory(asg *tetherv1.Assignment) error {
	if a.cfg.RootMode != RootModeSwitch {
		return nil // the cache is wherever the operator put the state dir
	}
	var need memcheck.Need
	for _, m := range asg.GetRootModules() {
		need.Root += uint64(max(m.GetSize(), 0))
	}
	for _, m := range asg.GetExtensionModules() {
		need.Extensions += uint64(max(m.GetSize(), 0))
	}
	need.Margin = a.cfg.MemoryMargin
	in, err := memcheck.Read(a.cfg.MemInfo)
	if err != nil {
		a.con.Printf("cannot check that the modules fit in memory: %v; fetching anyway", err)
		return nil
	}
	if err := memcheck.Check(in, need); err != nil {
		return &bootFailure{err}
	}
	a.con.Printf("memory: modules %s + margin %s fit in %s available of %s", memcheck.Size(need.Root+need.Extensions), memcheck.Size(need.Margin),
		memcheck.Size(in.Available), memcheck.Size(in.Total))
	return nil
}

// bootFailure is an error that retrying the boot cannot fix: the agent
// says so in its heartbeat (boot_failed), and the control plane errors the
// instance at once.
type bootFailure struct{ err error }

func (e *bootFailure) Error() string { return e.err.Error() }
func (e *bootFailure) Unwrap() error { return e.err }
