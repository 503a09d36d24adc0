package agent

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/tetherfleet/tether/agent/enroll"
)

// stateFile is what the agent hands to its successor across the switch of
// root, next to the identity files enroll keeps.
const stateFile = "agent.json"

// savedState is agent.json.
type savedState struct {
	// BootID ties the state to one boot: a state dir on a persistent disk
	// must not make a later boot think it already switched root.
	BootID string `json:"boot_id"`
	// Switched is set just before the switch: the agent reading it runs on
	// a root that an earlier agent of this boot composed.
	Switched bool `json:"switched"`
	// Modules are the digests of the root layers in use.
	Modules []string `json:"modules,omitempty"`
	// Extensions are the attached extension modules: name -> digest,
	// mounted at StateDir/ext/<name>.
	Extensions map[string]string `json:"extensions,omitempty"`
	// URL and CA let the successor reconnect without rediscovering them.
	URL string `json:"url,omitempty"`
	CA  string `json:"ca,omitempty"`
}

func loadState(dir string) (savedState, error) {
	var st savedState
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, err
	}
	err = json.Unmarshal(b, &st)
	return st, err
}

func saveState(dir string, st savedState) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return enroll.WriteFileAtomic(filepath.Join(dir, stateFile), append(b, '\n'), 0o600)
}
