// Command tether-agent is the node agent. As PID 1 of a netboot initramfs
// it sets the machine up, enrolls, pulls and verifies its root layers,
// switches into the composed root and hands over to its init; the agent
// that init starts (--root-mode=none) reconnects with the saved identity
// and keeps the node under control. Run by hand with --root-mode=none it
// enrolls and verifies without touching the machine.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"

	"golang.org/x/sys/unix"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/agent/boot"
	"github.com/tetherfleet/tether/agent/rootfs"
)

// version is set at build time: -ldflags "-X main.version=v1.2.3".
var version = "dev"

func main() {
	// u-root's DHCP client logs every packet through the standard logger;
	// the agent says on the console itself, once, what the network is.
	log.SetOutput(io.Discard)
	pid1 := os.Getpid() == 1
	fs := flag.NewFlagSet("tether-agent", flag.ContinueOnError)
	cp := fs.String("control-plane", "", "control plane URL, https://HOST:PORT, or several separated by commas to move between (default: discovered)")
	token := fs.String("token", "", "one-time bootstrap token (default: discovered)")
	instance := fs.String("instance", "", "instance id of a tokenless boot, proved by the TPM (default: discovered)")
	ca := fs.String("ca-sha256", "", "SHA-256 fingerprint of the control plane's CA certificate, sha256:HEX (default: discovered)")
	stateDir := fs.String("state-dir", agent.DefaultStateDir, "directory for the key, certificate and module cache")
	defaultMode := agent.RootModeNone
	if pid1 {
		defaultMode = agent.RootModeSwitch
	}
	rootMode := fs.String("root-mode", string(defaultMode), "switch: compose the root and switch into it (PID 1); none: verify only")
	allowPower := fs.Bool("allow-power", false, "let reboot and poweroff tasks act in --root-mode=none")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if pid1 {
			// PID 1 must not exit over a flag: carry on with the defaults.
			fmt.Fprintf(os.Stderr, "tether-agent: ignoring bad arguments %q: %v\n", os.Args[1:], err)
		} else {
			os.Exit(2)
		}
	}
	if *showVersion {
		fmt.Println(version)
		return
	}

	cfg := agent.Config{
		ControlPlane: *cp,
		Token:        *token,
		CASHA256:     *ca,
		Instance:     *instance,
		StateDir:     *stateDir,
		RootMode:     agent.RootMode(*rootMode),
		PID1:         pid1,
		AllowPower:   *allowPower,
		Version:      version,
		Root:         realRoot{},
		Extensions:   realExtensions{},
		PowerButtons: "/sys/class/input",
	}
	if pid1 {
		cfg.Boot = agent.BootSetupFunc(func(ctx context.Context, logf func(string, ...any)) error {
			return boot.Setup(ctx, boot.Config{Logf: logf})
		})
		agent.Supervise(context.Background(), cfg)
		return
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, unix.SIGTERM)
	defer stop()
	// After the root switch this agent is the one left running: it renews
	// the DHCP leases the boot agent took (none saved: nothing to do).
	go func() {
		logf := func(f string, a ...any) { fmt.Fprintf(os.Stderr, "tether-agent: "+f+"\n", a...) }
		if err := boot.KeepLeases(ctx, boot.DefaultLeaseDir, logf); err != nil {
			logf("DHCP leases in %s are not renewed: %v", boot.DefaultLeaseDir, err)
		}
	}()
	if err := agent.Run(ctx, cfg); err != nil {
		fmt.Fprintf(os.Stderr, "tether-agent: %v\n", err)
		os.Exit(1)
	}
}

// realRoot composes and switches with agent/rootfs's system calls.
type realRoot struct{}

func (realRoot) Compose(_ context.Context, layers []agent.Layer, workDir, target string) error {
	ls := make([]rootfs.Layer, len(layers))
	for i, l := range layers {
		ls[i] = rootfs.Layer{Name: l.Name, Path: l.Path}
	}
	_, err := rootfs.Compose(rootfs.RealSys(), ls, workDir, target)
	return err
}

func (realRoot) Switch(target string, beforeExec func()) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the agent binary to carry into the new root: %w", err)
	}
	err = rootfs.Switch(rootfs.RealSys(), target, rootfs.SwitchOptions{
		AgentPath:  exe,
		BeforeExec: beforeExec,
		Logf:       func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) },
	})
	if errors.Is(err, rootfs.ErrNoInit) {
		return fmt.Errorf("%w (%v)", agent.ErrNoInit, err)
	}
	return err
}

// realExtensions attaches extension modules with a loop device and a
// read-only erofs mount, and detaches them lazily (MNT_DETACH), so a
// process still inside the directory does not block an update.
type realExtensions struct{}

func (realExtensions) Attach(image, dir string) error {
	return rootfs.MountErofs(rootfs.RealSys(), image, dir)
}

func (realExtensions) Detach(dir string) error {
	if err := rootfs.RealSys().Unmount(dir, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmount %s: %w", dir, err)
	}
	return nil
}
