package agent

import (
	"context"
	"os"
	"os/exec"
	"time"

	"github.com/tetherfleet/tether/agent/identity"
	"github.com/tetherfleet/tether/agent/session"
)

// debugShells are tried in order when tether.debug=1 asks for a shell.
var debugShells = []string{"/bin/sh", "/bbin/gosh", "/bin/gosh", "/bbin/sh"}

// Supervise runs the agent as PID 1, which must never exit: the kernel
// panics when init does. A failed run is printed and retried with backoff;
// with tether.debug=1 on the kernel command line, a shell is started on the
// console first, and the run retried when it exits.
func Supervise(ctx context.Context, cfg Config) {
	if err := cfg.defaults(); err != nil {
		// A bad flag on PID 1 cannot be fixed by retrying; carry on with the
		// defaults rather than take the kernel down.
		cfg.RootMode = ""
		_ = cfg.defaults()
	}
	con := &console{w: cfg.Console, now: cfg.Clock.Now}
	backoff := session.DefaultBackoff(cfg.Rand)
	for attempt := 0; ; attempt++ {
		err := Run(ctx, cfg)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			// Run only returns nil when ctx ends; be safe anyway.
			attempt = -1
			continue
		}
		con.Printf("FAILED: %v", err)
		if c, cerr := identity.ReadCmdline(cfg.CmdlinePath); cerr == nil && c.Debug {
			debugShell(ctx, con)
		}
		d := backoff.Delay(min(attempt, 6))
		con.Printf("retrying the boot in %s (as PID 1 the agent never exits; add tether.debug=1 to the kernel command line for a shell on failure)", d.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return
		case <-cfg.Clock.After(d):
		}
	}
}

func debugShell(ctx context.Context, con *console) {
	for _, sh := range debugShells {
		if _, err := os.Stat(sh); err != nil {
			continue
		}
		con.Printf("tether.debug=1: starting %s on the console; exit it to retry the boot", sh)
		cmd := exec.CommandContext(ctx, sh)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			con.Printf("debug shell ended: %v", err)
		}
		return
	}
	con.Printf("tether.debug=1 but no shell found (looked for %v); build the initramfs with a shell to get one", debugShells)
}
