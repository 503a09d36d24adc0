package fake

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

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

// Open returns a fake whose machine list lives in a file, so that it
// survives the process and can be shared by several: tetherd's
// --provider-fake uses it so a chaos run can kill -9 the control plane
// (or one of its replicas) and still compare the fake's machines with the
// store's instances. Every call that reads or changes machines takes an
// exclusive flock on path+".lock", reloads the file, acts, and (if it
// changed a machine) rewrites the file atomically before unlocking, so
// Providers opened on one path in any number of processes act on one
// machine list.
func Open(path string, opts ...Option) (*Provider, error) {
	p := New(opts...)
	p.stateFile = path
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.inFile(false, func() {}); err != nil {
		return nil, err
	}
	return p, nil
}

// ReadFile reads a state file written by a fake made with Open. It takes
// no lock: the file is only ever replaced whole by a rename, so a reader
// sees one complete list.
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

// inFile runs f on the machine list as the state file holds it now: under
// the file's lock it reloads the list, runs f, and writes the list back
// when write is set. Without a state file it just runs f. Callers hold
// p.mu (which orders this process's calls; the flock orders processes).
func (p *Provider) inFile(write bool, f func()) error {
	if p.stateFile == "" {
		f()
		return nil
	}
	unlock, err := lockFile(p.stateFile + ".lock")
	if err != nil {
		return err
	}
	defer unlock()
	if err := p.load(); err != nil {
		return err
	}
	f()
	if write {
		return p.save()
	}
	return nil
}

// mustInFile is inFile for the test helpers that have no error to return.
// A helper that silently acted on a list its file no longer holds would
// let a test pass for the wrong reason, so a file that cannot be used
// panics.
func (p *Provider) mustInFile(write bool, f func()) {
	if err := p.inFile(write, f); err != nil {
		panic(err)
	}
}

// lockFile takes an exclusive flock on path (creating it) and returns the
// function that releases it. The kernel releases it too when the process
// dies, so a kill -9 never leaves the file locked.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("fake provider state lock: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("fake provider state lock %s: %w", path, err)
	}
	// Closing the descriptor releases the lock.
	return func() { _ = f.Close() }, nil
}

// load replaces the machine list with the file's; a file not written yet
// is an empty list. Callers hold p.mu and the file's lock.
func (p *Provider) load() error {
	ms, err := ReadFile(p.stateFile)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	clear(p.machines)
	for _, m := range ms {
		p.machines[m.ID] = &machine{m: providers.Machine{ID: m.ID, InstanceID: m.InstanceID, State: m.State},
			enrollment: m.Enrollment, boots: m.Boots}
	}
	return nil
}

// save writes the machine list: to a temp file in the same directory,
// synced, then renamed over the old one, so a crash at any point leaves
// either the old list or the new one (and at worst a stray temp file).
// Callers hold p.mu and the file's lock.
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
