package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tetherfleet/tether/agent/session"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// phaseAttach attaches the assigned extensions, on the node's own root
// only (see attaching).
func (a *agent) phaseAttach(ctx context.Context, s *bootState) error {
	if !a.attaching() {
		return nil
	}
	asg, err := a.assignment(ctx, s.conns)
	if err != nil {
		return err
	}
	_, err = a.syncExtensions(ctx, s.conns, asg)
	return err
}

// phaseServe reports ready and serves the control plane until the boot's
// context ends, then says goodbye.
func (a *agent) phaseServe(ctx context.Context, s *bootState) error {
	a.con.Printf("ready: instance %s, agent %s, boot %s", s.id.InstanceID, a.cfg.Version, a.cfg.BootID)
	a.setPhase(tetherv1.AgentPhase_AGENT_PHASE_READY)
	if err := a.cfg.Notifier.Notify("READY=1"); err != nil {
		a.con.Printf("telling the service manager we are ready failed: %v", err)
	}
	<-ctx.Done()
	a.goodbye(s.sess.get())
	return nil
}

// goodbyeTimeout bounds each half of the goodbye; with both it stays well
// inside the unit's TimeoutStopSec (handover.Unit).
const goodbyeTimeout = 3 * time.Second

// goodbye ends the session cleanly when the agent is stopped: the last
// heartbeat goes out, and the half-closed stream is drained, so the
// control plane has read everything (the result of a task that ran
// `systemctl poweroff`, say) and sees an orderly end, not a cut.
func (a *agent) goodbye(sess *session.Session) {
	if !sess.Connected() {
		a.con.Printf("stopping: no stream to the control plane is open; nothing more to report")
		sess.Close(0)
		return
	}
	sent := sess.WaitSent(context.Background(), goodbyeTimeout)
	if sess.Close(goodbyeTimeout) && sent {
		a.con.Printf("stopping: the last heartbeat was read by the control plane")
		return
	}
	a.con.Printf("stopping: the control plane did not confirm the last heartbeat within %s", goodbyeTimeout)
}

// reportEnd says on the console why a background part of the agent
// stopped before the agent did: it no longer does its job (a session that
// ended no longer reports, maintenance that ended no longer renews).
func (a *agent) reportEnd(ctx context.Context, what string, err error) {
	if err == nil || ctx.Err() != nil {
		return
	}
	a.status.SetError(fmt.Errorf("%s stopped: %w", what, err))
	a.con.Printf("%s stopped: %v; restart the agent (or reboot the node) to get it back", what, err)
}

// fail reports err in a heartbeat before the agent gives up on this run,
// so the control plane shows why the boot stopped.
func (a *agent) fail(ctx context.Context, sess *session.Session, err error) error {
	if ctx.Err() != nil {
		// Stopped mid-way: the cancellation is no fault of the boot, and
		// reporting it would error the instance of a node being shut down.
		a.goodbye(sess)
		return err
	}
	var gaveUp *bootFailure
	if errors.As(err, &gaveUp) {
		a.status.SetBootFailed(err)
	} else {
		a.status.SetError(err)
	}
	sess.WaitSent(ctx, 3*time.Second)
	sess.Close(3 * time.Second)
	return err
}
