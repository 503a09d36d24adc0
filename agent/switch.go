package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// switching says whether this agent composes a root and switches into it:
// in switch mode, unless it is the successor of this boot's switch.
func (a *agent) switching(s *bootState) bool {
	return a.cfg.RootMode == RootModeSwitch && !s.successor
}

// phaseCompose mounts the root layers into the new root and records, for
// the successor, that this boot switched.
func (a *agent) phaseCompose(ctx context.Context, s *bootState) error {
	if !a.switching(s) {
		return nil
	}
	root := a.cfg.Root
	if root == nil {
		return fmt.Errorf("%w; run with --root-mode=none to verify modules without switching", errNoRootSwitcher)
	}
	if len(s.layers) == 0 {
		return errors.New("the template assigns no root layers, so there is no root to switch into; add root modules to the template (tetherctl template create NAME --root MOD:VER) or run with --root-mode=none")
	}
	a.setPhase(tetherv1.AgentPhase_AGENT_PHASE_MOUNTING)
	if err := root.Compose(ctx, s.layers, a.cfg.RootWorkDir, a.cfg.RootTarget); err != nil {
		return fmt.Errorf("compose the root from %d layers at %s: %w (the kernel needs the loop, erofs and overlay modules)", len(s.layers), a.cfg.RootTarget, err)
	}
	st := &a.st
	st.Switched, st.Modules = true, s.digests[:len(s.layers)]
	if err := saveState(a.cfg.StateDir, *st); err != nil {
		return fmt.Errorf("save agent state for the new root: %w", err)
	}
	return nil
}

// phaseSwitch hands the node to the composed root's init. It returns only
// when there was none (the agent stays on as the root's supervisor) or the
// switch failed; either way the session is opened again.
func (a *agent) phaseSwitch(ctx context.Context, s *bootState) error {
	if !a.switching(s) {
		return nil
	}
	sess := s.sess.get()
	a.setPhase(tetherv1.AgentPhase_AGENT_PHASE_SWITCHING)
	// The exec ends this process's stream: get the phase out first, and
	// close the stream so nothing is left in a buffer. The control plane's
	// confirmation is a round trip, in which the guest's CPU would idle:
	// the switch moves the mounts and frees the initramfs meanwhile, and
	// waits for it just before the exec (or on its way out, if it fails).
	drained := make(chan bool, 1)
	go func() {
		sess.WaitSent(ctx, 3*time.Second)
		drained <- sess.Close(3 * time.Second)
	}()
	var waited sync.Once
	waitDrained := func() {
		waited.Do(func() {
			if !<-drained {
				a.con.Printf("the control plane did not confirm the switching heartbeat; switching anyway")
			}
		})
	}
	a.prepareHandover()
	a.con.Printf("switching root to %s", a.cfg.RootTarget)
	err := a.cfg.Root.Switch(a.cfg.RootTarget, waitDrained)
	// A Switch that returned did not exec; the stream must be closed
	// before it is opened again.
	waitDrained()
	if errors.Is(err, ErrNoInit) {
		a.con.Printf("%v: this agent stays on as the root's supervisor", err)
		a.startSession(s)
		return nil
	}
	if err == nil {
		err = errors.New("switch returned without error but did not exec the new init")
	}
	err = fmt.Errorf("switch root to %s: %w (the node may be half switched: reboot it once the cause is fixed)", a.cfg.RootTarget, err)
	st := &a.st
	st.Switched = false
	if serr := saveState(a.cfg.StateDir, *st); serr != nil {
		// The saved state still says switched: an agent started on this
		// root would take it for the composed one.
		err = errors.Join(err, fmt.Errorf("record the failed switch in %s: %w", a.cfg.StateDir, serr))
	}
	// The stream was closed for the exec; open it again so the failure
	// reaches the control plane.
	a.startSession(s)
	return err
}
