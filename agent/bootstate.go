package agent

import (
	"sync"

	"github.com/tetherfleet/tether/agent/enroll"
	"github.com/tetherfleet/tether/agent/identity"
	"github.com/tetherfleet/tether/agent/phases"
	"github.com/tetherfleet/tether/agent/session"
)

// bootState is what the phases of one boot hand each other; each phase
// reads what the ones before it set.
type bootState struct {
	// loops runs the background work a phase starts.
	loops *phases.Runner

	// successor: this agent runs on the root this boot's first agent
	// composed (set by discover).
	successor bool
	// explicit is the material given by flags; disc what discovery found.
	explicit identity.Fields
	disc     identity.Discovery

	// mgr keeps the identity, id is the one in use (set by enroll).
	mgr *enroll.Manager
	id  *enroll.Identity

	// Set by connect.
	conns    *connHolder
	recovery enroll.Recovery
	sess     sessionSlot

	// layers are the verified root layers and digests every verified
	// module (set by pull).
	layers  []Layer
	digests []string
}

// sessionSlot holds the open session: switch replaces it (a switch that
// found no init opens the stream again) while the reconnect loop uses it.
type sessionSlot struct {
	mu sync.Mutex
	s  *session.Session
}

func (h *sessionSlot) get() *session.Session {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.s
}

func (h *sessionSlot) set(s *session.Session) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.s = s
}
