package agent

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/tetherfleet/tether/agent/modules"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// ExtensionMounter attaches a verified extension module read-only at a
// directory and detaches it again (docs/design.md §5.7: extension modules are attached
// and detached live, root layers change on the next boot). The real one is
// a loop device + erofs mount (agent/rootfs.MountErofs).
type ExtensionMounter interface {
	Attach(image, dir string) error
	Detach(dir string) error
}

// extDir is where an extension is attached: /run/tether/ext/<name>.
func (a *agent) extDir(name string) string {
	return filepath.Join(a.cfg.StateDir, "ext", name)
}

// attaching reports whether this agent attaches extensions: only one
// running on the node's composed root (the successor, or a supervisor that
// found no init), never an agent run by hand on somebody's machine.
func (a *agent) attaching() bool {
	return a.cfg.Extensions != nil && a.st.Switched
}

// syncExtensions makes the attached extensions match the assignment:
// each is fetched (a cached one is verified again), then new ones are
// attached, ones no longer assigned are detached and changed ones are
// replaced. It records what is attached in the state file (an agent
// restarted by init must know what is mounted) and reports one line per
// change.
func (a *agent) syncExtensions(ctx context.Context, conns *connHolder, asg *tetherv1.Assignment) (string, error) {
	f, err := a.fetcher(conns)
	if err != nil {
		return "", err
	}
	want := map[string]*tetherv1.Module{}
	paths := map[string]string{}
	for _, m := range asg.GetExtensionModules() {
		if prev, dup := want[m.GetName()]; dup {
			return "", fmt.Errorf("the template assigns two versions of extension %s (%s and %s); one name is one mount point", m.GetName(), prev.GetVersion(), m.GetVersion())
		}
		path, err := f.Fetch(ctx, m)
		if err != nil {
			return "", err
		}
		want[m.GetName()], paths[m.GetName()] = m, path
	}
	if a.st.Extensions == nil {
		a.st.Extensions = map[string]string{}
	}
	var report []string
	for _, name := range sortedKeys(a.st.Extensions) {
		if m, ok := want[name]; ok && m.GetDigest() == a.st.Extensions[name] {
			continue
		}
		if err := a.cfg.Extensions.Detach(a.extDir(name)); err != nil {
			return strings.Join(report, ""), fmt.Errorf("detach extension %s from %s: %w (is something still using it?)", name, a.extDir(name), err)
		}
		delete(a.st.Extensions, name)
		report = append(report, fmt.Sprintf("detached extension %s from %s\n", name, a.extDir(name)))
		a.con.Printf("detached extension %s from %s", name, a.extDir(name))
	}
	for _, name := range sortedKeys(want) {
		m := want[name]
		if _, ok := a.st.Extensions[name]; ok {
			continue
		}
		if err := a.cfg.Extensions.Attach(paths[name], a.extDir(name)); err != nil {
			return strings.Join(report, ""), fmt.Errorf("attach extension %s at %s: %w (the kernel needs the loop and erofs modules)", modules.Name(m), a.extDir(name), err)
		}
		a.st.Extensions[name] = m.GetDigest()
		report = append(report, fmt.Sprintf("attached extension %s %s at %s\n", modules.Name(m), m.GetDigest(), a.extDir(name)))
		a.con.Printf("attached extension %s at %s", modules.Name(m), a.extDir(name))
	}
	if err := saveState(a.cfg.StateDir, a.st); err != nil {
		return strings.Join(report, ""), fmt.Errorf("record attached extensions: %w", err)
	}
	a.reportModules()
	return strings.Join(report, ""), nil
}

// reportModules puts the root layers and the attached extensions in the
// heartbeat's running module digests.
func (a *agent) reportModules() {
	running := slices.Clone(a.st.Modules)
	for _, name := range sortedKeys(a.st.Extensions) {
		running = append(running, a.st.Extensions[name])
	}
	a.status.SetModules(running)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
