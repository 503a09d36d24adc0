package agent

import (
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"

	"github.com/tetherfleet/tether/agent/identity"
	"github.com/tetherfleet/tether/agent/memcheck"
	"github.com/tetherfleet/tether/agent/tasks"
	"github.com/tetherfleet/tether/internal/clock"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// RootMode says whether the agent switches into the composed root.
type RootMode string

const (
	// RootModeSwitch composes the root from the layers and switches into
	// it (the agent is PID 1 in an initramfs).
	RootModeSwitch RootMode = "switch"
	// RootModeNone verifies the layers and reports ready without touching
	// the machine: the agent after the switch of root, or one run by hand.
	RootModeNone RootMode = "none"
)

// DefaultStateDir survives the switch of root: /run is moved into it.
const DefaultStateDir = "/run/tether"

// Config configures an agent. Only the zero value's defaults touch the real
// machine; a test sets StateDir, DialOptions, Sources and the interfaces.
type Config struct {
	// Explicit enrollment material (flags); empty fields are discovered.
	ControlPlane string
	Token        string
	CASHA256     string
	// Instance names the instance of a tokenless, TPM-attested boot.
	Instance string

	StateDir string   // default /run/tether
	RootMode RootMode // default switch when PID1, else none
	// PID1 is set when the agent is the initramfs's init: it then runs
	// BootSetup, reaps orphans and must never exit (see Supervise).
	PID1 bool
	// AllowPower lets reboot and poweroff tasks act in root mode none.
	AllowPower bool
	Version    string

	// Sources are consulted in order (default identity.DefaultSources()).
	Sources []identity.Source
	// CmdlinePath is read for tether.debug (default /proc/cmdline).
	CmdlinePath string
	// Anchor says where the node's signer anchor is read from (default:
	// the kernel command line at CmdlinePath, fw_cfg, /etc/tether/signers).
	Anchor identity.AnchorSources

	// Console receives the operator-facing lines (default os.Stderr).
	Console io.Writer
	Clock   clock.Clock
	// Rand drives the backoff jitter (default: seeded from the system).
	Rand *rand.Rand
	// DialOptions are added to every connection (tests inject dialers).
	DialOptions []grpc.DialOption

	Boot BootSetup
	Root RootSwitcher
	// RootTarget is where the new root is composed (default /newroot), and
	// RootWorkDir holds the layer mounts and the writable layer (default
	// StateDir/rootfs, under /run so they move into the new root with it).
	RootTarget  string
	RootWorkDir string
	// Extensions attaches extension modules at StateDir/ext/<name> on the
	// node's own root (nil: they are fetched and verified, not attached).
	Extensions ExtensionMounter
	// Power acts on reboot and poweroff tasks. Default: the real one when
	// the agent runs the node (switch mode, after this boot's switch, or
	// with AllowPower), a dry run otherwise.
	Power tasks.Power

	// PowerButtons, when set, is the sysfs input class (/sys/class/input)
	// searched for the ACPI power button; a press powers the node off the
	// way a poweroff task does, so a provider's graceful stop is graceful.
	// Empty: no watch (tests, an agent run by hand).
	PowerButtons string

	// MemInfo is read before a switch-mode fetch to check that the node's
	// memory holds the modules (default /proc/meminfo); MemoryMargin is
	// what must be left over (default memcheck.DefaultMargin).
	MemInfo      string
	MemoryMargin uint64

	// RunDir is the /run that the switch moves into the new root, where a
	// systemd root's unit for the agent is written (default /run).
	RunDir string

	// OnPhase is told about every phase change (tests, metrics).
	OnPhase func(tetherv1.AgentPhase)
	// BootID defaults to the kernel's per-boot id (read after BootSetup,
	// once /proc is mounted).
	BootID    string
	Uptime    func() time.Duration
	Addresses func() []string
	// Notifier defaults to sd_notify (a no-op without NOTIFY_SOCKET).
	Notifier Notifier
	// ConnGrace is how long an old connection lives after a renewal
	// (default 1 minute).
	ConnGrace time.Duration

	// OpenTPM opens the machine's TPM for a tokenless, attested
	// enrollment (default: agent/tpm at /dev/tpmrm0). It returns an
	// error wrapping tpm.ErrNoTPM when the machine has none.
	OpenTPM func() (AttesterCloser, error)
}

func (c *Config) defaults() error {
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	switch c.RootMode {
	case "":
		c.RootMode = RootModeNone
		if c.PID1 {
			c.RootMode = RootModeSwitch
		}
	case RootModeSwitch, RootModeNone:
	default:
		return fmt.Errorf("root mode %q: want switch or none", c.RootMode)
	}
	if c.Sources == nil {
		c.Sources = identity.DefaultSources()
	}
	if c.Console == nil {
		c.Console = os.Stderr
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Rand == nil {
		c.Rand = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	if c.RootTarget == "" {
		c.RootTarget = "/newroot"
	}
	if c.RunDir == "" {
		c.RunDir = "/run"
	}
	if c.MemInfo == "" {
		c.MemInfo = "/proc/meminfo"
	}
	if c.MemoryMargin == 0 {
		c.MemoryMargin = memcheck.DefaultMargin
	}
	if c.RootWorkDir == "" {
		c.RootWorkDir = filepath.Join(c.StateDir, "rootfs")
	}
	if c.Uptime == nil {
		c.Uptime = systemUptime
	}
	if c.Addresses == nil {
		c.Addresses = localAddresses
	}
	if c.Notifier == nil {
		c.Notifier = systemdNotifier{}
	}
	if c.ConnGrace == 0 {
		c.ConnGrace = time.Minute
	}
	if c.Version == "" {
		c.Version = "dev"
	}
	return nil
}
