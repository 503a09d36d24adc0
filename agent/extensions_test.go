package agent

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherfleet/tether/agent/identity"
	"github.com/tetherfleet/tether/agent/modules"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// fakeMounter records attaches and detaches.
type fakeMounter struct {
	mu       sync.Mutex
	attached map[string]string // dir -> image
	log      []string
}

func (m *fakeMounter) Attach(image, dir string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.attached == nil {
		m.attached = map[string]string{}
	}
	if _, busy := m.attached[dir]; busy {
		return fmt.Errorf("%s is already mounted", dir)
	}
	m.attached[dir] = image
	m.log = append(m.log, "attach "+filepath.Base(dir))
	return nil
}

func (m *fakeMounter) Detach(dir string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.attached[dir]; !ok {
		return fmt.Errorf("%s is not mounted", dir)
	}
	delete(m.attached, dir)
	m.log = append(m.log, "detach "+filepath.Base(dir))
	return nil
}

func (m *fakeMounter) snapshot() (map[string]string, []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]string{}
	for k, v := range m.attached {
		out[k] = v
	}
	return out, slices.Clone(m.log)
}

// TestExtensionsAttachedOnTheSwitchedRoot: the agent running the node's
// composed root attaches the template's extension modules, verified, at
// StateDir/ext/<name>, reports them in its heartbeats, and module_sync
// detaches, replaces and attaches them as the assignment changes.
func TestExtensionsAttachedOnTheSwitchedRoot(t *testing.T) {
	cp := newControlPlane(t)
	asg := cp.assign(t, 1, 2)
	state := t.TempDir()
	src := cmdline(t, cp.URL, cp.AddToken("i-9"), cp.ca.Fingerprint)
	root := &fakeRoot{switched: make(chan struct{}), release: make(chan struct{})}
	first := start(t, Config{StateDir: state, Sources: []identity.Source{src}, RootMode: RootModeSwitch, Root: root, RootTarget: "/newroot",
		Extensions: &fakeMounter{}})
	t.Cleanup(func() { first.cancel(); close(root.release) })
	cp.stream(t) // the first agent's stream; the successor opens the next
	select {
	case <-root.switched:
	case <-time.After(20 * time.Second):
		t.Fatal("the agent never switched root")
	}

	m := &fakeMounter{}
	next := start(t, Config{StateDir: state, Sources: []identity.Source{src}, RootMode: RootModeNone, Extensions: m})
	next.phases.wait(t, tetherv1.AgentPhase_AGENT_PHASE_READY)
	attached, _ := m.snapshot()
	for _, e := range asg.ExtensionModules {
		image, ok := attached[filepath.Join(state, "ext", e.Name)]
		if !ok {
			t.Fatalf("extension %s not attached: %v", e.Name, attached)
		}
		if err := modules.VerifyFile(image, e.Digest); err != nil {
			t.Fatalf("extension %s attached unverified: %v", e.Name, err)
		}
	}
	s := cp.stream(t)
	hb := s.waitFor(t, "a heartbeat with the extensions", func(msg *tetherv1.AgentMessage) bool {
		return len(msg.GetHeartbeat().GetRunningModuleDigests()) == 3
	}).GetHeartbeat()
	if hb.RunningModuleDigests[0] != asg.RootModules[0].Digest || !slices.Contains(hb.RunningModuleDigests, asg.ExtensionModules[1].Digest) {
		t.Fatalf("running modules %v", hb.RunningModuleDigests)
	}

	// The template changes: ext-0 is dropped, ext-1 gets new content.
	newer := cp.assign(t, 0, 2) // fresh blobs named ext-0, ext-1
	cp.Lock()
	cp.Assignment = &tetherv1.Assignment{RootModules: asg.RootModules, ExtensionModules: []*tetherv1.Module{newer.ExtensionModules[1]}}
	cp.Unlock()
	s.send <- &tetherv1.ControlMessage{Msg: &tetherv1.ControlMessage_Task{Task: &tetherv1.TaskAssignment{TaskId: "sync", Kind: tetherv1.TaskKind_TASK_KIND_MODULE_SYNC}}}
	u := s.update(t, "sync", tetherv1.TaskStatus_TASK_STATUS_SUCCEEDED)
	out := string(u.Result.GetOutput())
	for _, want := range []string{"detached extension ext-0", "detached extension ext-1", "attached extension ext-1:1 " + newer.ExtensionModules[1].Digest, "drift: none"} {
		if !strings.Contains(out, want) {
			t.Fatalf("module_sync output lacks %q:\n%s", want, out)
		}
	}
	attached, log := m.snapshot()
	if len(attached) != 1 || modules.VerifyFile(attached[filepath.Join(state, "ext", "ext-1")], newer.ExtensionModules[1].Digest) != nil {
		t.Fatalf("attached after sync: %v (log %v)", attached, log)
	}
}

// TestExtensionsNotAttachedByHand: an agent run by hand (root mode none,
// no switch this boot) verifies extensions but mounts nothing.
func TestExtensionsNotAttachedByHand(t *testing.T) {
	cp := newControlPlane(t)
	cp.assign(t, 1, 1)
	m := &fakeMounter{}
	r := start(t, Config{StateDir: t.TempDir(), Sources: []identity.Source{cmdline(t, cp.URL, cp.AddToken("i-4"), cp.ca.Fingerprint)}, Extensions: m})
	r.phases.wait(t, tetherv1.AgentPhase_AGENT_PHASE_READY)
	if attached, _ := m.snapshot(); len(attached) != 0 {
		t.Fatalf("a hand-run agent mounted %v", attached)
	}
}
