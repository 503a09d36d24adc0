package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/providers/fake"
)

// serveFlags are `tetherd serve`'s flags that are not options of the
// daemon: how it logs, and the chaos runs' fake provider.
type serveFlags struct {
	level, format string
	providerFake  bool
	fakeState     string
}

func serveCmd() *cobra.Command {
	var o daemon.ServeOptions
	var sf serveFlags
	cmd := &cobra.Command{
		Use:   "serve --data-dir DIR",
		Short: "Run the control plane",
		Args:  cobra.NoArgs,
		RunE:  func(*cobra.Command, []string) error { return serve(o, sf) },
	}
	f := cmd.Flags()
	replicaFlags(f, &o)
	listenFlags(f, &o.Listeners)
	providerFlags(f, &o.Providers)
	livenessFlags(f, &o.Liveness, &o.Loops)
	limitFlags(f, &o.Limits)
	testFlags(f, &o.Test, &sf)
	f.StringVar(&sf.level, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&sf.format, "log-format", "text", "text or json")
	_ = cmd.MarkFlagRequired("data-dir")
	return cmd
}

// serve is `tetherd serve` from its flags to its end: the logger, the
// fake provider when a chaos run asks for it, the signals (TERM and INT
// stop, HUP reloads the server certificate), then the daemon until a
// signal or a failure.
func serve(o daemon.ServeOptions, sf serveFlags) error {
	log, err := logger(sf.level, sf.format)
	if err != nil {
		return err
	}
	o.Log = log
	if sf.providerFake {
		p, err := openFake(o.DataDir, sf.fakeState, log)
		if err != nil {
			return err
		}
		o.Test.Providers = append(o.Test.Providers, p)
	}
	if o.Store == "" {
		o.Store = os.Getenv("TETHER_STORE")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	o.ReloadServerCert = onSIGHUP(ctx)
	return daemon.Serve(ctx, o)
}

// openFake opens the --provider-fake machine file (DATA/fake-machines.json
// unless --provider-fake-state names another).
func openFake(dataDir, state string, log *slog.Logger) (*fake.Provider, error) {
	if state == "" {
		state = filepath.Join(dataDir, FakeMachinesFile)
	}
	p, err := fake.Open(state)
	if err != nil {
		return nil, fmt.Errorf("--provider-fake: %w", err)
	}
	log.Warn("the fake provider is enabled: for chaos runs and tests only", "state", state)
	return p, nil
}

// replicaFlags are what this replica is: its data, store, artifacts and
// signers.
func replicaFlags(f *pflag.FlagSet, o *daemon.ServeOptions) {
	f.StringVar(&o.DataDir, "data-dir", "", "data directory made by `tetherd init` (required)")
	f.StringVar(&o.Store, "store", "", "sqlite (default) or a postgres:// URL; also $TETHER_STORE")
	f.StringSliceVar(&o.SigningKeyFiles, "module-signing-key", nil, "Ed25519 public key files that module signatures may verify with")
	f.StringVar(&o.Kernel, "kernel", "", "default netboot kernel (bzImage); stored content addressed in the data dir at start-up")
	f.StringVar(&o.Initramfs, "initramfs", "", "default netboot initramfs; stored content addressed in the data dir at start-up")
	f.StringArrayVar(&o.UKIs, "uki", nil, "TEMPLATE=FILE: the signed unified kernel image (tetherctl bootimage build) that machines of TEMPLATE boot over UEFI HTTP Boot or chained from iPXE; repeatable, stored in the data dir at start-up")
	f.StringVar(&o.Replica, "replica-name", "", "this replica's name in agent presence; keep it stable across restarts (default HOSTNAME/LISTEN-ADDRESS)")
	f.StringSliceVar(&o.SelfInstanceIDs, "self-instance", nil, "instance ids that host this control plane (drain refuses them)")
}

// listenFlags are where tetherd listens and how machines reach it.
func listenFlags(f *pflag.FlagSet, o *daemon.ListenOptions) {
	f.StringVar(&o.GRPC, "listen", "127.0.0.1:7443", "gRPC listen address")
	f.StringVar(&o.Metrics, "metrics-listen", "", "serve Prometheus metrics on this address at /metrics (off by default)")
	f.BoolVar(&o.Pprof, "pprof", false, "also serve /debug/pprof on --metrics-listen (off by default: profiles and goroutine dumps are for whoever reaches that address)")
	f.StringVar(&o.AgentURL, "agent-url", "", "control plane URL handed to agents (default https://10.0.2.2:PORT, the host as a QEMU guest sees it)")
	f.StringVar(&o.Netboot, "netboot-listen", "", "serve kernels, initramfs and per-instance iPXE scripts over HTTP on this address (off by default)")
	f.BoolVar(&o.NetbootAnnounce, "netboot-announce", false, "boot a machine with an unknown hardware address into the agent, which announces its TPM's endorsement key for `tetherctl netboot seen` and `node adopt`, instead of refusing it (off by default: a refused machine falls back to its next boot device)")
	f.StringVar(&o.NetbootURL, "netboot-url", "", "netboot server URL as machines reach it (default http://10.0.2.2:PORT, or the --dhcp-interface address)")
	f.StringVar(&o.PXE.Interface, "dhcp-interface", "", "answer DHCP for netbooting machines on this interface (off by default; needs --netboot-listen)")
	f.StringVar(&o.PXE.Mode, "dhcp-mode", "", "proxy: boot information only, beside the site's DHCP server; full: also lease addresses from --dhcp-range")
	f.StringVar(&o.PXE.Range, "dhcp-range", "", "full mode: addresses to lease, FIRST-LAST, in the interface's subnet")
	f.StringVar(&o.PXE.Router, "dhcp-router", "", "full mode: default gateway handed out")
	f.StringVar(&o.PXE.DNS, "dhcp-dns", "", "full mode: DNS server handed out")
	f.StringVar(&o.PXE.IPXEDir, "ipxe-dir", "", "directory of the iPXE loaders undionly.kpxe, ipxe.efi, snponly.efi (default /usr/lib/ipxe, Debian's ipxe package)")
	f.StringVar(&o.PXE.TFTPListen, "tftp-listen", "", "serve the iPXE loaders over TFTP on this address (default the --dhcp-interface address, port 69)")
}

// providerFlags configure the built-in providers.
func providerFlags(f *pflag.FlagSet, o *daemon.ProviderOptions) {
	f.StringVar(&o.QEMU.Mode, "qemu-mode", "real", "qemu provider mode: real (boot VMs), recorder (record what it would do) or disabled")
	f.StringVar(&o.QEMU.Boot, "qemu-boot", "direct", "how qemu VMs boot: direct (kernel, initramfs and token handed to QEMU), bios (SeaBIOS + the NIC's iPXE ROM), uefi (OVMF + iPXE) or uefi-http (OVMF's own HTTP Boot of the template's --uki image, no iPXE); bios, uefi and uefi-http fetch everything over the network")
	f.BoolVar(&o.QEMU.SecureBoot, "qemu-secure-boot", false, "boot qemu VMs' OVMF with Secure Boot on (OVMF_CODE_4M.secboot.fd, a copy of OVMF_VARS_4M.snakeoil.fd per VM, q35 with SMM): needs --qemu-boot uefi or uefi-http")
	f.BoolVar(&o.QEMU.TPM, "qemu-tpm", false, "give every qemu VM a TPM 2.0 (tpm-crb, one swtpm per VM; needs the swtpm and swtpm-tools packages): the TPM is its node's, kept in QEMU-STATE/tpm/NODE across the node's instances")
	f.StringVar(&o.QEMU.Tap, "qemu-tap", "", "put qemu VMs on this tap device (a bridge port where tetherd's DHCP answers) instead of QEMU's user-mode network; one VM at a time")
	f.DurationVar(&o.Redfish.GracefulTimeout, "redfish-graceful-timeout", 60*time.Second, "how long a redfish stop waits for a graceful shutdown before forcing the power off")
	f.DurationVar(&o.Redfish.PowerTimeout, "redfish-power-timeout", 60*time.Second, "how long a redfish power action waits for the BMC's PowerState to show it")
	f.StringVar(&o.QEMU.StateDir, "qemu-state-dir", "", "qemu VM state directory (default DATA/machines; QMP sockets live here, so keep it short)")
	f.StringVar(&o.Libvirt.URI, "libvirt-uri", "", "enable the libvirt provider on this libvirtd: qemu:///system, qemu:///session, qemu+unix:///system?socket=PATH, qemu+tcp://HOST/system or qemu+tls://HOST/system (off by default)")
	f.StringVar(&o.Libvirt.StateDir, "libvirt-state-dir", "", "libvirt provider state directory: console logs, and token files while a domain boots (default DATA/libvirt)")
	f.StringVar(&o.Libvirt.Boot, "libvirt-boot", "direct", "how libvirt domains boot: direct (kernel, initramfs and token handed to libvirtd; needs a local libvirtd), network (the firmware's iPXE fetches everything from --netboot-listen) or uefi-http (OVMF's own HTTP Boot of the template's --uki image, no iPXE; needs --libvirt-firmware uefi)")
	f.StringVar(&o.Libvirt.Firmware, "libvirt-firmware", "bios", "libvirt domain firmware: bios (SeaBIOS) or uefi (OVMF, with a per-domain NVRAM removed on terminate)")
	f.BoolVar(&o.Libvirt.SecureBoot, "libvirt-secure-boot", false, "boot libvirt domains' OVMF with Secure Boot on (<loader secure='yes'> OVMF_CODE_4M.secboot.fd, NVRAM from OVMF_VARS_4M.snakeoil.fd, SMM on); needs --libvirt-firmware uefi")
	f.BoolVar(&o.Libvirt.TPM, "libvirt-tpm", false, "give every libvirt domain a TPM 2.0 (<tpm model='tpm-crb'> with libvirtd's swtpm emulator)")
	f.StringVar(&o.Libvirt.Network, "libvirt-network", "user", "libvirt domain NIC: user (QEMU user-mode networking, the host is 10.0.2.2), network:NAME (a libvirt network) or bridge:NAME")
	f.StringVar(&o.Libvirt.DomainType, "libvirt-domain-type", "auto", "libvirt domain type: auto (kvm when libvirtd offers it, else qemu), kvm or qemu (TCG)")
	f.IntVar(&o.Libvirt.MemoryMiB, "libvirt-memory", 512, "libvirt domain memory in MiB")
	f.IntVar(&o.Libvirt.CPUs, "libvirt-cpus", 1, "libvirt domain vCPUs")
	f.StringVar(&o.Libvirt.FileOwner, "libvirt-file-owner", "", "give the files QEMU reads and writes in the libvirt state directory to this user (USER or UID:GID): the user libvirtd runs QEMU as, e.g. libvirt-qemu for Debian's qemu:///system (default: leave them tetherd's)")
	f.DurationVar(&o.Libvirt.StopGrace, "libvirt-stop-grace", 3*time.Second, "how long a libvirt stop waits after the ACPI power button before destroying the domain")
}

// livenessFlags are how agents are judged and how often the loops look.
func livenessFlags(f *pflag.FlagSet, live *daemon.LivenessOptions, loops *daemon.LoopOptions) {
	f.DurationVar(&live.SilentAfter, "silent-after", 0, "raise instance.silent after this long without a heartbeat (default 3m; stretches with fleet size)")
	f.DurationVar(&live.BootTimeout, "boot-timeout", 0, "error an instance whose boot makes no progress for this long (default 15m)")
	f.DurationVar(&live.SwitchTimeout, "switch-timeout", 0, "error a boot whose agent does not come back this long after switching into the root's init (default 3m)")
	f.DurationVar(&live.PresumedDeadAfter, "presumed-dead-after", 0, "error a silent instance whose machine is not running after this long (default 10m; stretches with fleet size)")
	f.DurationVar(&loops.ProviderSyncEvery, "provider-sync-every", 0, "compare instances with the providers' machines this often (default 1m)")
	f.DurationVar(&live.PresenceLease, "presence-lease", 0, "how long an agent stays claimable after the replica holding its stream stops renewing (a crash); default 15s")
	f.DurationVar(&live.AgentSweep, "agent-sweep", 0, "look for agent tasks whose notification was lost this often, in one query (default 20s)")
}

// limitFlags bound what unauthenticated clients can spend.
func limitFlags(f *pflag.FlagSet, o *daemon.LimitOptions) {
	f.Float64Var(&o.UnauthenticatedRate, "unauthenticated-rate", 20, "enrollments and netboot script requests allowed per second per source address, on average (negative: no limit)")
	f.IntVar(&o.UnauthenticatedBurst, "unauthenticated-burst", 200, "enrollments and netboot script requests allowed at once per source address")
	f.IntVar(&o.MaxAgentConnections, "max-agent-connections", 0, "refuse new connections at accept time past this many open (default: the descriptor limit minus --fd-reserve; -1: no cap)")
	f.IntVar(&o.FDReserve, "fd-reserve", daemon.DefaultFDReserve, "descriptors kept for the store, listeners and providers when deriving --max-agent-connections")
	f.IntVar(&o.MaxUnauthenticatedPerSource, "max-unauthenticated-per-source", daemon.DefaultMaxUnauthenticatedPerSource, "unauthenticated connections (handshaking, or without a CA-signed client certificate) one source address may hold; past it its oldest is closed for the new one (-1: no cap)")
	f.DurationVar(&o.UnauthenticatedAge, "unauthenticated-age", 0, "close a connection without a CA-signed client certificate this long after it was accepted (default 30s)")
	f.DurationVar(&o.HandshakeTimeout, "handshake-timeout", 0, "close a connection whose TLS and HTTP/2 handshakes take longer (default 5s)")
}

// testFlags are for measurements and chaos runs only.
func testFlags(f *pflag.FlagSet, o *daemon.TestHooks, sf *serveFlags) {
	f.BoolVar(&o.DisableAudit, "no-audit", false, "turn the audit trail off (only to measure its cost)")
	_ = f.MarkHidden("no-audit")
	f.BoolVar(&sf.providerFake, "provider-fake", false, "TESTING ONLY (make chaos): add the in-memory fake provider, its machines kept in DATA/"+FakeMachinesFile+" with their tokens")
	f.StringVar(&sf.fakeState, "provider-fake-state", "", "TESTING ONLY: the --provider-fake machine file (default DATA/"+FakeMachinesFile+"); replicas given one file share one machine list (it is flock'ed)")
}

// FakeMachinesFile is where --provider-fake keeps its machines, in the data dir.
const FakeMachinesFile = "fake-machines.json"

func logger(level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	default:
		return nil, fmt.Errorf("--log-format %q: want text or json", format)
	}
}

// onSIGHUP turns each SIGHUP into a reload of the server certificate.
func onSIGHUP(ctx context.Context) <-chan struct{} {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	reload := make(chan struct{}, 1)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				select {
				case reload <- struct{}{}:
				default: // one pending reload covers every signal before it
				}
			}
		}
	}()
	return reload
}
