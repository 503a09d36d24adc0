package session

import (
	"sync"

	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// Status is what the agent reports about itself in each heartbeat. The
// orchestrator writes it; the session reads it and sends a heartbeat at
// once whenever the phase or the error changes.
type Status struct {
	mu      sync.Mutex
	phase   tetherv1.AgentPhase
	lastErr string
	modules []string
	// bootFailed: lastErr ended this boot (SetBootFailed).
	bootFailed bool
	// gen counts reportable changes, so a caller can wait until a heartbeat
	// carrying a given change has gone out.
	gen     uint64
	changed chan struct{}
}

// NewStatus starts in phase discovering.
func NewStatus() *Status {
	return &Status{phase: tetherv1.AgentPhase_AGENT_PHASE_DISCOVERING, changed: make(chan struct{}, 1)}
}

// SetPhase records a phase change, to be reported immediately.
func (s *Status) SetPhase(p tetherv1.AgentPhase) {
	s.mu.Lock()
	changed := s.phase != p
	s.phase = p
	if changed {
		s.gen++
	}
	s.mu.Unlock()
	if changed {
		s.signal()
	}
}

// Phase returns the current phase.
func (s *Status) Phase() tetherv1.AgentPhase {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.phase
}

// SetError records the last error (nil clears it), reported immediately.
func (s *Status) SetError(err error) {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	s.mu.Lock()
	changed := s.lastErr != msg
	s.lastErr = msg
	if err == nil {
		s.bootFailed = false
	}
	if changed {
		s.gen++
	}
	s.mu.Unlock()
	if changed {
		s.signal()
	}
}

// SetBootFailed records err as the last error and says the agent gave up
// this boot (Heartbeat.boot_failed): the control plane errors the
// instance at once instead of waiting out its boot timeout.
func (s *Status) SetBootFailed(err error) {
	s.mu.Lock()
	s.bootFailed = true
	s.gen++
	s.mu.Unlock()
	s.SetError(err)
	s.signal()
}

// SetModules records the digests of the modules the node runs.
func (s *Status) SetModules(digests []string) {
	s.mu.Lock()
	s.modules = append([]string(nil), digests...)
	s.mu.Unlock()
}

// Modules returns the running module digests.
func (s *Status) Modules() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.modules...)
}

func (s *Status) signal() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

func (s *Status) generation() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen
}

func (s *Status) snapshot() (tetherv1.AgentPhase, string, []string, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.phase, s.lastErr, append([]string(nil), s.modules...), s.gen
}

func (s *Status) failed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bootFailed && s.lastErr != ""
}
