package daemon

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/tetherfleet/tether/controlplane/bmc"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/external"
	"github.com/tetherfleet/tether/providers/qemu"
	"github.com/tetherfleet/tether/providers/redfish"
)

// maxSocketPath is the longest unix socket path (sun_path is 108 bytes
// with its NUL); qemu's QMP socket lives at STATE/<instance id>/qmp.sock.
const maxSocketPath = 107

// instanceIDLen is the length of an instance id (a UUID).
const instanceIDLen = 36

// buildProviders returns the configured providers by name: external,
// qemu in the chosen mode, redfish (nodes' BMCs, found through bmcs), and any the options inject (tests add the fake
// provider this way; an injected provider replaces a built-in one of the
// same name).
func buildProviders(o ServeOptions, log *slog.Logger, clk clock.Clock, bmcs *bmc.Resolver) (map[string]providers.Provider, error) {
	mode, err := qemu.ParseMode(o.QEMUMode)
	if err != nil {
		return nil, fmt.Errorf("serve: --qemu-mode: %w", err)
	}
	stateDir := o.QEMUStateDir
	if stateDir == "" {
		stateDir = filepath.Join(o.DataDir, MachineDir)
	}
	if stateDir, err = filepath.Abs(stateDir); err != nil {
		return nil, fmt.Errorf("serve: qemu state dir: %w", err)
	}
	if sock := filepath.Join(stateDir, fmt.Sprintf("%0*d", instanceIDLen, 0), "qmp.sock"); mode == qemu.ModeReal && len(sock) > maxSocketPath {
		// Not fatal: a control plane that never boots a qemu VM works, and
		// the provider refuses each launch with the same explanation.
		log.Warn("qemu state dir is too long for QMP sockets: qemu provisioning will fail; use --qemu-state-dir with a shorter path",
			"state_dir", stateDir, "socket_bytes", len(sock), "limit", maxSocketPath,
			"longest_state_dir", maxSocketPath-len(sock)+len(stateDir))
	}
	bootMode, err := qemu.ParseBootMode(o.QEMUBoot)
	if err != nil {
		return nil, fmt.Errorf("serve: --qemu-boot: %w", err)
	}
	q, err := qemu.New(qemu.Config{Mode: mode, StateDir: stateDir, Boot: bootMode, Tap: o.QEMUTap,
		Logger: log.With("provider", "qemu"), Clock: clk})
	if err != nil {
		return nil, fmt.Errorf("serve: qemu provider: %w", err)
	}
	rf, err := redfish.New(redfish.Config{Resolver: bmcs, Clock: clk, Logger: log.With("provider", "redfish"), Warn: bmcs.Warn,
		GracefulTimeout: o.RedfishGracefulTimeout, PowerTimeout: o.RedfishPowerTimeout, RequestTimeout: o.RedfishRequestTimeout})
	if err != nil {
		return nil, fmt.Errorf("serve: redfish provider: %w", err)
	}
	out := map[string]providers.Provider{external.Name: external.New(), qemu.Name: q, redfish.Name: rf}
	for _, p := range o.Providers {
		out[p.Name()] = p
	}
	return out, nil
}

// ingestArtifact stores a netboot artifact in the blob store and returns
// its digest; "" when no path was given.
func ingestArtifact(blobs *modules.Blobs, flag, path string) (string, error) {
	if path == "" {
		return "", nil
	}
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("serve: %s: %w", flag, err)
	}
	defer f.Close()
	digest, _, err := blobs.Ingest(f, false)
	if err != nil {
		return "", fmt.Errorf("serve: %s %s: store it: %w", flag, path, err)
	}
	return digest, nil
}
