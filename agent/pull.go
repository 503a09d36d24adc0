package agent

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/tetherfleet/tether/agent/modules"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// phasePull fetches and verifies the assigned modules. The successor of a
// switch has them: it reports the ones in use instead.
func (a *agent) phasePull(ctx context.Context, s *bootState) error {
	if s.successor {
		a.reportModules()
		a.con.Printf("running on the root this boot's first agent composed (%d root layers verified before the switch)", len(a.st.Modules))
		return nil
	}
	asg, err := a.assignment(ctx, s.conns)
	if err != nil {
		return err
	}
	s.layers, s.digests, err = a.pull(ctx, s.conns, asg)
	if err != nil {
		return err
	}
	a.status.SetModules(s.digests)
	return nil
}

func (a *agent) assignment(ctx context.Context, conns *connHolder) (*tetherv1.Assignment, error) {
	var asg *tetherv1.Assignment
	err := a.retry(ctx, "fetching the module assignment", func() error {
		var err error
		asg, err = conns.Client().GetAssignment(ctx, &tetherv1.GetAssignmentRequest{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("get assignment: %w", err)
	}
	return asg, nil
}

// pull fetches and verifies every assigned module, root layers first. It
// returns the root layers and the digests of every verified module.
func (a *agent) pull(ctx context.Context, conns *connHolder, asg *tetherv1.Assignment) ([]Layer, []string, error) {
	if err := a.checkSignatures(asg); err != nil {
		return nil, nil, err
	}
	if err := a.checkMemory(asg); err != nil {
		return nil, nil, err
	}
	a.setPhase(tetherv1.AgentPhase_AGENT_PHASE_PULLING)
	f, err := a.fetcher(conns)
	if err != nil {
		return nil, nil, err
	}
	var layers []Layer
	var digests []string
	for i, m := range append(append([]*tetherv1.Module(nil), asg.GetRootModules()...), asg.GetExtensionModules()...) {
		path, err := f.Fetch(ctx, m)
		if err != nil {
			return nil, nil, err
		}
		if i < len(asg.GetRootModules()) {
			layers = append(layers, Layer{Name: modules.Name(m), Path: path})
		}
		digests = append(digests, m.GetDigest())
	}
	return layers, digests, nil
}

// checkSignatures applies the signing policy (the node's anchor, then what
// the assignment adds) before anything is fetched, and says so on the
// console: a refusal names the module and the reason.
func (a *agent) checkSignatures(asg *tetherv1.Assignment) error {
	start := a.cfg.Clock.Now()
	err := modules.CheckSignatures(asg, a.policy)
	n := len(asg.GetRootModules()) + len(asg.GetExtensionModules())
	if err != nil {
		a.con.Printf("REFUSED: %v; this root will not be mounted", err)
		return err
	}
	if len(a.policy.Anchors) > 0 || len(asg.GetRequiredSigners()) > 0 || asg.GetRequireSignedModules() {
		a.con.Printf("signatures: %d modules verified in %s", n, a.cfg.Clock.Now().Sub(start).Round(time.Microsecond))
	}
	return nil
}

func (a *agent) fetcher(conns *connHolder) (*modules.Fetcher, error) {
	return modules.New(modules.Config{
		Dir:      filepath.Join(a.cfg.StateDir, "modules"),
		Client:   conns.Client,
		Progress: newProgressPrinter(a.con).report,
		Logf:     a.con.Printf,
		Delay:    a.backoff.Delay,
		After:    a.cfg.Clock.After,
	})
}
