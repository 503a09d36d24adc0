package agent

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/tetherfleet/tether/agent/enroll"
	"github.com/tetherfleet/tether/agent/modules"
	"github.com/tetherfleet/tether/agent/tasks"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// executor wires the task kinds to this agent's parts.
func (a *agent) executor(mgr *enroll.Manager, conns *connHolder, successor bool) *tasks.Executor {
	return a.executorWith(mgr, conns, a.power(successor))
}

// power is what acts on reboot and poweroff, from a task or the power button.
func (a *agent) power(successor bool) tasks.Power {
	power := a.cfg.Power
	if power == nil {
		// The agent may power the machine off when the machine is the
		// node it booted: it switched root (or is the agent this boot's
		// switch started), or the operator said so.
		switch {
		case (a.cfg.AllowPower || successor) && a.cfg.underSystemd():
			power = tasks.SystemdPower{}
		case a.cfg.AllowPower || a.cfg.RootMode == RootModeSwitch || successor:
			power = tasks.SystemPower{}
		default:
			power = tasks.DryRunPower{Logf: a.con.Printf}
		}
	}
	return power
}

func (a *agent) executorWith(mgr *enroll.Manager, conns *connHolder, power tasks.Power) *tasks.Executor {
	return &tasks.Executor{
		Power: power,
		Procs: a.procs,
		Logf:  a.con.Printf,
		Sync:  func(ctx context.Context) (string, error) { return a.moduleSync(ctx, conns) },
		Renew: func(ctx context.Context) (string, error) {
			id, err := mgr.Renew(ctx, conns.Client())
			if err != nil {
				return "", err
			}
			a.con.Printf("certificate renewed on request (valid until %s)", stamp(id.Cert.NotAfter))
			return fmt.Sprintf("renewed: new key, certificate serial %s valid until %s\n", id.Cert.SerialNumber, stamp(id.Cert.NotAfter)), nil
		},
	}
}

// moduleSync fetches the assignment again, verifies every module in it
// and reports how the assigned root layers differ from the running ones.
func (a *agent) moduleSync(ctx context.Context, conns *connHolder) (string, error) {
	asg, err := conns.Client().GetAssignment(ctx, &tetherv1.GetAssignmentRequest{})
	if err != nil {
		return "", fmt.Errorf("get assignment: %w", err)
	}
	if err := a.checkSignatures(asg); err != nil {
		return "", err
	}
	f, err := a.fetcher(conns)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	var assignedRoot []string
	for i, m := range append(append([]*tetherv1.Module(nil), asg.GetRootModules()...), asg.GetExtensionModules()...) {
		if _, err := f.Fetch(ctx, m); err != nil {
			fmt.Fprintf(&b, "FAILED %s %s: %v\n", modules.Name(m), m.GetDigest(), err)
			return b.String(), err
		}
		kind := "extension"
		if i < len(asg.GetRootModules()) {
			kind = "root layer"
			assignedRoot = append(assignedRoot, m.GetDigest())
		}
		fmt.Fprintf(&b, "verified %s %s %s\n", kind, modules.Name(m), m.GetDigest())
	}
	if a.attaching() {
		changes, err := a.syncExtensions(ctx, conns, asg)
		b.WriteString(changes)
		if err != nil {
			return b.String(), err
		}
	}
	running := a.st.Modules
	if !a.st.Switched {
		running = a.status.Modules()
	}
	if len(running) > len(assignedRoot) {
		running = running[:len(assignedRoot)]
	}
	if slices.Equal(running, assignedRoot) {
		b.WriteString("drift: none\n")
	} else {
		fmt.Fprintf(&b, "drift: the running root layers [%s] differ from the assigned [%s]; root layers change on the next boot (reboot the instance to apply)\n",
			strings.Join(running, " "), strings.Join(assignedRoot, " "))
	}
	return b.String(), nil
}
