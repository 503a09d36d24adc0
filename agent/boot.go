package agent

import "github.com/tetherfleet/tether/agent/phases"

// boot is the agent's boot, in order; each phase is a function of the
// boot's state. The console and the heartbeats keep naming the same phases
// (setPhase, inside them): discovering at setup, enrolling in enroll (or
// in connect, for an expired certificate), pulling in pull, mounting in
// compose, switching in switch, ready in serve. The successor of a switch
// (the agent the new root's init started) passes through pull, compose and
// switch without acting.
func (a *agent) boot() phases.List[bootState] {
	return phases.List[bootState]{}.
		Append("setup", a.phaseSetup).
		Append("announce", a.phaseAnnounce).
		Append("discover", a.phaseDiscover).
		Append("enroll", a.phaseEnroll).
		Append("connect", a.phaseConnect).
		Append("pull", a.phasePull).
		Append("compose", a.phaseCompose).
		Append("switch", a.phaseSwitch).
		Append("attach", a.phaseAttach).
		Append("serve", a.phaseServe)
}
