package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/tetherfleet/tether/agent/identity"
	"github.com/tetherfleet/tether/agent/modules"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// phaseSetup is what PID 1 does first: reap orphans, and the pseudo
// filesystems, modules and network (BootSetup).
func (a *agent) phaseSetup(ctx context.Context, s *bootState) error {
	cfg := a.cfg
	// The kernel's clock lines this up with the kernel's own console
	// stamps: the time from "Run /init" to here is the agent's start-up.
	a.con.Printf("tether-agent %s starting as pid %d (root mode %s, state in %s, kernel up %s)", cfg.Version, os.Getpid(), cfg.RootMode, cfg.StateDir, bootClock().Round(time.Millisecond))
	a.setPhase(tetherv1.AgentPhase_AGENT_PHASE_DISCOVERING)
	if cfg.PID1 {
		s.loops.Go("reaping orphans", func(ctx context.Context) error { reapOrphans(ctx, a.procs); return nil })
		if cfg.Boot != nil {
			if err := cfg.Boot.Setup(ctx, a.con.Printf); err != nil {
				return fmt.Errorf("boot setup: %w", err)
			}
		}
	}
	if a.cfg.BootID == "" {
		a.cfg.BootID = kernelBootID()
	}
	return nil
}

// phaseDiscover reads the saved state and finds the control plane, its CA
// pin and the enrollment material, and the node's signer anchor.
func (a *agent) phaseDiscover(ctx context.Context, s *bootState) error {
	cfg := a.cfg
	loaded, err := loadState(cfg.StateDir)
	if err != nil {
		a.con.Printf("ignoring unreadable %s: %v (delete it if this repeats)", filepath.Join(cfg.StateDir, stateFile), err)
		loaded = savedState{}
	}
	a.st = loaded
	s.successor = a.st.Switched && a.st.BootID == cfg.BootID

	s.explicit = identity.Fields{URL: cfg.ControlPlane, Token: cfg.Token, CA: cfg.CASHA256, Instance: cfg.Instance}
	sources := cfg.Sources
	if s.successor {
		// The hand-off is served once per boot, and the agent before the
		// switch had it; this one enrolled already.
		sources = withoutHandoff(sources)
	}
	disc, err := identity.Discover(ctx, s.explicit, sources...)
	if err != nil {
		return fmt.Errorf("discover enrollment material: %w", err)
	}
	for _, w := range disc.Warnings {
		a.con.Printf("%s", w)
	}
	if disc.URL == "" && a.st.URL != "" {
		disc.URL, disc.From["url"] = a.st.URL, "saved state"
	}
	if disc.CA == "" && a.st.CA != "" {
		disc.CA, disc.From["ca"] = a.st.CA, "saved state"
	}
	if err := disc.Require(false); err != nil {
		return err
	}
	s.disc = disc
	a.con.Printf("control plane %s, CA pinned to %s (%s)", disc.URL, disc.CA, disc.Summary())
	anchorSrc := cfg.Anchor
	if anchorSrc.CmdlinePath == "" {
		anchorSrc.CmdlinePath = cfg.CmdlinePath
	}
	anchor, err := identity.DiscoverAnchor(anchorSrc)
	if err != nil {
		return fmt.Errorf("signer anchor: %w (a node with a damaged anchor boots nothing)", err)
	}
	a.policy = modules.Policy{Anchors: anchor.Signers}
	a.con.Printf("%s", anchor)
	return nil
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// withoutHandoff drops the per-boot hand-off from sources.
func withoutHandoff(sources []identity.Source) []identity.Source {
	out := make([]identity.Source, 0, len(sources))
	for _, s := range sources {
		if _, ok := s.(identity.HandoffSource); !ok {
			out = append(out, s)
		}
	}
	return out
}
