package redfishtest

import (
	"context"
	"errors"
	"sync"

	"github.com/tetherfleet/tether/providers/redfish"
)

// FakeMachine is an in-memory Machine.
type FakeMachine struct {
	mu    sync.Mutex
	state redfish.PowerState
	// IgnoreGraceful makes graceful shutdowns and restarts do nothing,
	// like an OS with no ACPI handler.
	IgnoreGraceful bool
	// Fail, when set, is returned by every power change.
	Fail error
	// Restarts counts restarts.
	Restarts int
}

// NewFakeMachine returns a machine in state (On or Off).
func NewFakeMachine(state redfish.PowerState) *FakeMachine { return &FakeMachine{state: state} }

// PowerOn implements Machine.
func (m *FakeMachine) PowerOn(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Fail != nil {
		return m.Fail
	}
	m.state = redfish.PowerOn
	return nil
}

// PowerOff implements Machine.
func (m *FakeMachine) PowerOff(_ context.Context, graceful bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Fail != nil {
		return m.Fail
	}
	if graceful && m.IgnoreGraceful {
		return nil
	}
	m.state = redfish.PowerOff
	return nil
}

// Restart implements Machine.
func (m *FakeMachine) Restart(_ context.Context, graceful bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Fail != nil {
		return m.Fail
	}
	if m.state != redfish.PowerOn {
		return errors.New("restart of a machine that is off")
	}
	if graceful && m.IgnoreGraceful {
		return nil
	}
	m.Restarts++
	return nil
}

// PowerState implements Machine.
func (m *FakeMachine) PowerState(context.Context) (redfish.PowerState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state, nil
}

// Set forces the power state (a person at the machine's button).
func (m *FakeMachine) Set(s redfish.PowerState) {
	m.mu.Lock()
	m.state = s
	m.mu.Unlock()
}
