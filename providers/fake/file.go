package fake

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/tetherfleet/tether/providers"
)

// FileMachine is one machine as the state file holds it. The enrollment
// (with its token) is kept so that a harness playing the machines can boot
// them: this file is test-only, like the provider itself.
type FileMachine struct {
	ID         string                 `json:"id"`
	InstanceID string                 `json:"instance_id"`
	State      providers.MachineState `json:"state"`
	Boots      int                    `json:"boots"`
	Enrollment providers.Enrollment   `json:"enrollment"`
}

// Open returns a fake whose machine list survives the process: it loads
// path if it exists and rewrites it (atomically, synced) after every call
// that changes a machine. tetherd's --provider-fake uses it so a chaos run
// can kill -9 the control plane and still compare the fake's machines with
// the store's instances.
func Open(path string, opts ...Option) (*Provider, error) {
	p := New(opts...)
	p.stateFile = path
	ms, err := ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	for _, m := range ms {
		p.machines[m.ID] = &machine{m: providers.Machine{ID: m.ID, InstanceID: m.InstanceID, State: m.State},
			enrollment: m.Enrollment, boots: m.Boots}
	}
	return p, nil
}

// ReadFile reads a state file written by a fake made with Open.
func ReadFile(path string) ([]FileMachine, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("fake provider state: %w", err)
	}
	var ms []FileMachine
	if err := json.Unmarshal(raw, &ms); err != nil {
		return nil, fmt.Errorf("fake provider state %s: %w", path, err)
	}
	return ms, nil
}

func mutates(op Op) bool {
	return op != OpStatus && op != OpList
}

// save writes the machine list. Callers hold p.mu.
func (p *Provider) save() error {
	ms := make([]FileMachine, 0, len(p.machines))
	for _, m := range p.snapshot() {
		mm := p.machines[m.ID]
		ms = append(ms, FileMachine{ID: m.ID, InstanceID: m.InstanceID, State: m.State, Boots: mm.boots, Enrollment: mm.enrollment})
	}
	raw, err := json.Marshal(ms)
	if err != nil {
		return fmt.Errorf("fake provider state: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(p.stateFile), ".fake-machines-*")
	if err != nil {
		return fmt.Errorf("fake provider state: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(raw); err != nil {
		tmp.Close()
		return fmt.Errorf("fake provider state: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("fake provider state: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("fake provider state: %w", err)
	}
	if err := os.Rename(tmp.Name(), p.stateFile); err != nil {
		return fmt.Errorf("fake provider state: %w", err)
	}
	return nil
}
