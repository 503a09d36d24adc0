package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/tetherfleet/tether/controlplane/bmc"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/external"
	"github.com/tetherfleet/tether/providers/libvirt"
	"github.com/tetherfleet/tether/providers/qemu"
	"github.com/tetherfleet/tether/providers/redfish"
)

// maxSocketPath is the longest unix socket path (sun_path is 108 bytes
// with its NUL); qemu's QMP socket lives at STATE/<instance id>/qmp.sock.
const maxSocketPath = 107

// instanceIDLen is the length of an instance id (a UUID).
const instanceIDLen = 36

// LibvirtDir is the libvirt provider's default state directory in the data
// dir (console logs, and a token file for the moment of a boot).
const LibvirtDir = "libvirt"

// LibvirtOptions are tetherd's --libvirt-* flags.
type LibvirtOptions struct {
	// URI turns the provider on: qemu:///system, qemu:///session,
	// qemu+unix:///system?socket=PATH, qemu+tcp://HOST/system,
	// qemu+tls://HOST/system.
	URI string
	// StateDir defaults to DATA/libvirt.
	StateDir   string
	Boot       string // direct (default), network or uefi-http
	Firmware   string // bios (default) or uefi
	Network    string // user (default), network:NAME or bridge:NAME
	DomainType string // auto (default), kvm or qemu
	MemoryMiB  int
	CPUs       int
	// FileOwner owns what QEMU reads and writes in StateDir ("USER" or
	// "UID:GID"): the user libvirtd runs QEMU as.
	FileOwner string
	StopGrace time.Duration
	// TPM gives every domain a TPM 2.0 (libvirtd's swtpm).
	TPM bool
	// SecureBoot boots OVMF with Secure Boot enforced.
	SecureBoot bool
}

// libvirtCheckTimeout bounds the start-up probe of libvirtd.
const libvirtCheckTimeout = 5 * time.Second

// buildLibvirt returns the libvirt provider, or nil when --libvirt-uri is
// not given. A libvirtd that does not answer at start-up is logged, not
// fatal: it may come up later, and until then each operation fails with a
// transient error naming its socket.
func buildLibvirt(o ServeOptions, log *slog.Logger, clk clock.Clock) (*libvirt.Provider, error) {
	lo := o.Providers.Libvirt
	if lo.URI == "" {
		return nil, nil
	}
	boot, err := libvirt.ParseBootMode(lo.Boot)
	if err != nil {
		return nil, fmt.Errorf("serve: --libvirt-boot: %w", err)
	}
	fw, err := libvirt.ParseFirmware(lo.Firmware)
	if err != nil {
		return nil, fmt.Errorf("serve: --libvirt-firmware: %w", err)
	}
	nw, err := libvirt.ParseNetwork(lo.Network)
	if err != nil {
		return nil, fmt.Errorf("serve: --libvirt-network: %w", err)
	}
	stateDir := lo.StateDir
	if stateDir == "" {
		stateDir = filepath.Join(o.DataDir, LibvirtDir)
	}
	plog := log.With("provider", libvirt.Name)
	p, err := libvirt.New(libvirt.Config{URI: lo.URI, StateDir: stateDir, Boot: boot, Firmware: fw, Network: nw,
		DomainType: lo.DomainType, MemoryMiB: lo.MemoryMiB, CPUs: lo.CPUs, FileOwner: lo.FileOwner,
		StopGrace: lo.StopGrace, TPM: lo.TPM, SecureBoot: lo.SecureBoot, Logger: plog, Clock: clk})
	if err != nil {
		return nil, fmt.Errorf("serve: libvirt provider: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), libvirtCheckTimeout)
	defer cancel()
	if typ, err := p.Check(ctx); err != nil {
		plog.Warn("libvirtd does not answer: libvirt operations will fail until it does", "uri", lo.URI, "err", err)
	} else {
		plog.Info("libvirtd answers", "uri", lo.URI, "domain_type", typ)
	}
	return p, nil
}

// buildProviders returns the configured providers by name: external,
// qemu in the chosen mode, libvirt when --libvirt-uri is given, redfish
// (nodes' BMCs, found through bmcs), and any the options inject (tests add the fake
// provider this way; an injected provider replaces a built-in one of the
// same name).
func buildProviders(o ServeOptions, log *slog.Logger, clk clock.Clock, bmcs *bmc.Resolver) (map[string]providers.Provider, error) {
	mode, err := qemu.ParseMode(o.Providers.QEMU.Mode)
	if err != nil {
		return nil, fmt.Errorf("serve: --qemu-mode: %w", err)
	}
	stateDir := o.Providers.QEMU.StateDir
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
	bootMode, err := qemu.ParseBootMode(o.Providers.QEMU.Boot)
	if err != nil {
		return nil, fmt.Errorf("serve: --qemu-boot: %w", err)
	}
	q, err := qemu.New(qemu.Config{Mode: mode, StateDir: stateDir, Boot: bootMode, Tap: o.Providers.QEMU.Tap, TPM: o.Providers.QEMU.TPM, SecureBoot: o.Providers.QEMU.SecureBoot,
		Logger: log.With("provider", "qemu"), Clock: clk})
	if err != nil {
		return nil, fmt.Errorf("serve: qemu provider: %w", err)
	}
	rf, err := redfish.New(redfish.Config{Resolver: bmcs, Clock: clk, Logger: log.With("provider", "redfish"), Warn: bmcs.Warn,
		GracefulTimeout: o.Providers.Redfish.GracefulTimeout, PowerTimeout: o.Providers.Redfish.PowerTimeout, RequestTimeout: o.Providers.Redfish.RequestTimeout})
	if err != nil {
		return nil, fmt.Errorf("serve: redfish provider: %w", err)
	}
	out := map[string]providers.Provider{external.Name: external.New(), qemu.Name: q, redfish.Name: rf}
	lv, err := buildLibvirt(o, log, clk)
	if err != nil {
		return nil, err
	}
	if lv != nil {
		out[libvirt.Name] = lv
	}
	for _, p := range o.Test.Providers {
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
