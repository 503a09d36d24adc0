package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"golang.org/x/sys/unix"

	"github.com/tetherfleet/tether/agent/tasks"
)

// systemUptime is the machine's uptime, which carries on across the
// switch of root (the agent's own start time does not).
func systemUptime() time.Duration {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0
	}
	return time.Duration(si.Uptime) * time.Second
}

// bootClock is the time since the kernel started (CLOCK_BOOTTIME), the
// clock of the kernel's console stamps; 0 if it cannot be read.
func bootClock() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// localAddresses lists the node's non-loopback addresses.
func localAddresses() []string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []string
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok || ipn.IP.IsLoopback() || ipn.IP.IsLinkLocalUnicast() {
			continue
		}
		out = append(out, ipn.IP.String())
	}
	return out
}

// kernelBootID is random per boot and the same for every process of that
// boot, so the agent after the switch of root reports the same boot_id as
// the one before it.
func kernelBootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if id := strings.TrimSpace(string(b)); err == nil && id != "" {
		return id
	}
	return randomID()
}

func randomID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Notifier tells a service manager about the agent's state.
type Notifier interface {
	Notify(state string) error
	// WatchdogInterval is how often to ping, 0 when no watchdog is set.
	WatchdogInterval() time.Duration
}

// systemdNotifier speaks sd_notify when NOTIFY_SOCKET is set, and is
// silent otherwise.
type systemdNotifier struct{}

func (systemdNotifier) Notify(state string) error {
	_, err := daemon.SdNotify(false, state)
	return err
}

func (systemdNotifier) WatchdogInterval() time.Duration {
	d, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		return 0
	}
	return d
}

// pingWatchdog pings at half the watchdog interval until ctx ends.
func pingWatchdog(ctx context.Context, n Notifier) {
	d := n.WatchdogInterval()
	if d <= 0 {
		return
	}
	t := time.NewTicker(d / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = n.Notify(daemon.SdNotifyWatchdog)
		}
	}
}

// reapOrphans collects the zombies PID 1 inherits from processes whose
// parents died, on every SIGCHLD, sparing the children the agent waits for
// itself.
func reapOrphans(ctx context.Context, reg *tasks.Registry) {
	ch := make(chan os.Signal, 16)
	signal.Notify(ch, unix.SIGCHLD)
	defer signal.Stop(ch)
	// Signals coalesce; a periodic sweep catches any that were merged.
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
		case <-t.C:
		}
		reg.Reap("/proc")
	}
}
