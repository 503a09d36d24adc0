package redfishtest

import (
	"context"
	"fmt"
	"sync"

	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/qemu"
	"github.com/tetherfleet/tether/providers/redfish"
)

// QEMUMachine is a real VM behind a test BMC system, launched through the
// qemu provider in a netboot mode (bios or uefi): powering it on boots
// SeaBIOS or OVMF and the NIC's iPXE, which netboots from Boot.KernelURL's
// server bound to MAC, as a bare-metal machine's firmware would.
type QEMUMachine struct {
	P *qemu.Provider
	// ID names the VM in the qemu provider (its state directory).
	ID  string
	MAC string
	// Boot tells the VM's firmware where the netboot server is.
	Boot providers.Boot

	mu      sync.Mutex
	created bool
}

// PowerOn implements Machine: the first one creates the VM, later ones
// start it again.
func (m *QEMUMachine) PowerOn(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.created {
		if _, err := m.P.Provision(ctx, providers.Spec{InstanceID: m.ID, MAC: m.MAC, Boot: m.Boot}); err != nil {
			return err
		}
		m.created = true
		return nil
	}
	_, err := m.P.Start(ctx, m.ID, m.Boot)
	return err
}

// PowerOff implements Machine. The qemu provider's stop asks ACPI first
// and quits QEMU after its grace, which covers both kinds.
func (m *QEMUMachine) PowerOff(ctx context.Context, _ bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.created {
		return nil
	}
	_, err := m.P.Stop(ctx, m.ID)
	return err
}

// Restart implements Machine.
func (m *QEMUMachine) Restart(ctx context.Context, _ bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, err := m.P.Reboot(ctx, m.ID, m.Boot)
	return err
}

// PowerState implements Machine from the VM's observed state.
func (m *QEMUMachine) PowerState(ctx context.Context) (redfish.PowerState, error) {
	m.mu.Lock()
	created := m.created
	m.mu.Unlock()
	if !created {
		return redfish.PowerOff, nil
	}
	st, err := m.P.Status(ctx, m.ID)
	if err != nil {
		return "", err
	}
	switch st.State {
	case providers.StateRunning:
		return redfish.PowerOn, nil
	case providers.StatePaused:
		return redfish.PowerPaused, nil
	case providers.StateStopped, providers.StateGone:
		return redfish.PowerOff, nil
	}
	// A real BMC that cannot tell answers an error, never Off: Off would
	// tell tetherd the machine died.
	return "", fmt.Errorf("the VM's state is %s (%s)", st.State, st.Detail)
}

// Destroy removes the VM and its files.
func (m *QEMUMachine) Destroy(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.created {
		return nil
	}
	m.created = false
	return m.P.Terminate(ctx, m.ID)
}
