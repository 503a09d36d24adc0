// Package agent is the node agent's orchestrator. Run takes a node from
// nothing to ready as a list of named phases (boot.go): discover the
// enrollment material, enroll (or reuse the identity saved by this boot's
// first agent), open the Connect stream so the control plane watches every
// phase live, pull and verify the root layers, and, in switch mode,
// compose the root and switch into it. A small runner (agent/phases) owns
// the background loops the phases start and stops them when the run ends.
// Every step that touches the machine sits behind an interface
// (BootSetup, RootSwitcher, tasks.Power), so tests run whole agents
// in-process.
package agent

import (
	"context"
	"strings"

	"github.com/tetherfleet/tether/agent/modules"
	"github.com/tetherfleet/tether/agent/phases"
	"github.com/tetherfleet/tether/agent/session"
	"github.com/tetherfleet/tether/agent/tasks"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// agent holds what lives as long as one run: its tools, and what the task
// executors read while the session serves (the saved state, the signing
// policy). What the phases hand each other is in bootState.
type agent struct {
	cfg     Config
	con     *console
	status  *session.Status
	backoff session.Backoff
	procs   *tasks.Registry
	// st is this boot's saved state (agent.json in the state dir).
	st savedState
	// policy holds the node's signer anchor, read once at start.
	policy modules.Policy
}

// Run takes the node to ready and then serves the control plane until ctx
// ends (it returns nil then). It returns an error for a failure it cannot
// retry away, with a message that says what to do. Transient failures
// (control plane unreachable) are retried with backoff, forever.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.defaults(); err != nil {
		return err
	}
	a := &agent{
		cfg:     cfg,
		con:     &console{w: cfg.Console, now: cfg.Clock.Now},
		status:  session.NewStatus(),
		backoff: session.DefaultBackoff(cfg.Rand),
		procs:   tasks.NewRegistry(),
	}
	err := a.run(ctx)
	if err != nil && ctx.Err() != nil {
		return nil
	}
	return err
}

// run runs the boot's phases. A failure once the session is open is
// reported in a heartbeat before the loops stop, so the control plane
// shows why the boot stopped; the error names its phase (*phases.Error).
func (a *agent) run(ctx context.Context) error {
	r := phases.NewRunner(ctx, a.reportEnd)
	defer r.Stop()
	s := &bootState{loops: r}
	err := a.boot().Run(r.Context(), s)
	if sess := s.sess.get(); err != nil && sess != nil {
		return a.fail(r.Context(), sess, err)
	}
	return err
}

func (a *agent) setPhase(p tetherv1.AgentPhase) {
	if a.status.Phase() != p || p == tetherv1.AgentPhase_AGENT_PHASE_DISCOVERING {
		a.con.Printf("phase %s", phaseName(p))
	}
	a.status.SetPhase(p)
	if a.cfg.OnPhase != nil {
		a.cfg.OnPhase(p)
	}
}

// phaseName is how the console names a phase: "pulling".
func phaseName(p tetherv1.AgentPhase) string {
	return strings.ToLower(strings.TrimPrefix(p.String(), "AGENT_PHASE_"))
}
