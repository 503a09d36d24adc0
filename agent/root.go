package agent

import (
	"context"
	"errors"
)

// BootSetup prepares the initramfs as PID 1: pseudo-filesystems, kernel
// modules, network. The real one is agent/boot (boot.Setup); tests and
// hand-run agents skip it.
type BootSetup interface {
	Setup(ctx context.Context, logf func(format string, args ...any)) error
}

// BootSetupFunc adapts a function.
type BootSetupFunc func(ctx context.Context, logf func(format string, args ...any)) error

func (f BootSetupFunc) Setup(ctx context.Context, logf func(format string, args ...any)) error {
	return f(ctx, logf)
}

// Layer is one verified root layer, bottom first.
type Layer struct {
	Name string // name:version
	Path string // the verified module file
}

// RootSwitcher composes the root filesystem from verified layers and
// switches into it. The real one wraps agent/rootfs (Compose, Switch);
// tests use a fake.
type RootSwitcher interface {
	// Compose mounts the layers as an overlay at target, with its writable
	// upper layer under workDir.
	Compose(ctx context.Context, layers []Layer, workDir, target string) error
	// Switch moves /dev, /proc, /sys and /run into target, makes it the
	// root and execs its init; on success it does not return. It calls
	// beforeExec once the new root is in place, right before the exec (the
	// agent waits there for the control plane to confirm its last
	// heartbeat, which the switch's own work overlaps). It returns
	// ErrNoInit when the new root has no init, in which case the agent
	// carries on as the root's supervisor.
	Switch(target string, beforeExec func()) error
}

// ErrNoInit is returned by RootSwitcher.Switch when the composed root has
// no init to hand over to.
var ErrNoInit = errors.New("the composed root has no /sbin/init")

// errNoRootSwitcher is what a build without agent/rootfs reports.
var errNoRootSwitcher = errors.New("this agent build cannot compose and switch root (no root switcher configured)")
