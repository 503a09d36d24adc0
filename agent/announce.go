package agent

import (
	"context"
	"fmt"
	"os"

	"github.com/tetherfleet/tether/agent/announce"
	"github.com/tetherfleet/tether/agent/boot"
	"github.com/tetherfleet/tether/agent/identity"
	"github.com/tetherfleet/tether/agent/phases"
)

// phaseAnnounce ends the boot in announce mode: the machine announces
// itself instead of enrolling.
func (a *agent) phaseAnnounce(ctx context.Context, _ *bootState) error {
	done, err := a.announceMode(ctx)
	if done && err == nil {
		return phases.Done
	}
	return err
}

// announceMode runs the agent in announce mode when the kernel command
// line says tether.announce= (an unknown machine the netboot server booted
// to announce its TPM, docs/adr/0030); done is false otherwise, and the
// agent enrolls as usual. A command line that does not parse is left to
// discovery, which says what is wrong with it.
func (a *agent) announceMode(ctx context.Context) (done bool, err error) {
	path := a.cfg.CmdlinePath
	if path == "" {
		path = identity.DefaultCmdlinePath
	}
	raw, rerr := os.ReadFile(path)
	if rerr != nil {
		return false, nil
	}
	c, perr := identity.ParseTetherCmdline(string(raw))
	if perr != nil || c.Announce == "" {
		return false, nil
	}
	v, ok := boot.CmdlineValue(string(raw), "BOOTIF")
	if !ok {
		return true, fmt.Errorf("announce mode (tether.announce=%s) needs BOOTIF=01-<mac>, the interface the machine booted from, on the kernel command line", c.Announce)
	}
	mac, err := boot.ParseBOOTIF(v)
	if err != nil {
		return true, fmt.Errorf("announce mode: %w", err)
	}
	power := a.power(false)
	return true, announce.Run(ctx, announce.Config{URL: c.Announce, MAC: mac.String(), OpenTPM: a.openTPM, Clock: a.cfg.Clock,
		Logf: a.con.Printf, Reboot: power.Reboot})
}
