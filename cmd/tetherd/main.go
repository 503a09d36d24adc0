// Command tetherd is the Tether control plane: `tetherd init` creates a data
// dir (CA, server certificate, admin identity); `tetherd serve` runs it.
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

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/providers/fake"
)

func main() {
	if err := root().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "tetherd:", err)
		os.Exit(1)
	}
}

func root() *cobra.Command {
	cmd := &cobra.Command{Use: "tetherd", Short: "Tether control plane", SilenceUsage: true, SilenceErrors: true}
	cmd.AddCommand(initCmd(), serveCmd(), backupCmd(), restoreCmd(), renewServerCertCmd())
	return cmd
}

func initCmd() *cobra.Command {
	var o daemon.InitOptions
	cmd := &cobra.Command{
		Use:   "init --data-dir DIR",
		Short: "Create the CA, the server certificate and an admin identity in DIR",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := daemon.Init(o); err != nil {
				return err
			}
			if o.RotateAdmin {
				fmt.Printf("issued a new admin identity certificate in %s/%s\n  the next start of tetherd serve records it and revokes every earlier admin certificate: restart tetherd now\n",
					o.DataDir, daemon.AdminDir)
				return nil
			}
			fmt.Printf("initialised %s\n  admin client config: %s/%s/%s\n  next: tetherd serve --data-dir %s\n",
				o.DataDir, o.DataDir, daemon.AdminDir, daemon.ClientConfig, o.DataDir)
			return nil
		},
	}
	cmd.Flags().StringVar(&o.DataDir, "data-dir", "", "data directory to create (required)")
	cmd.Flags().StringSliceVar(&o.Advertise, "advertise", nil, "extra host names or addresses for the server certificate")
	cmd.Flags().StringVar(&o.Endpoint, "endpoint", "127.0.0.1:7443", "address written into the admin client config")
	cmd.Flags().BoolVar(&o.RotateAdmin, "rotate-admin", false, "in an existing data dir, replace only the admin identity: a new key and certificate in DIR/admin; the next tetherd serve revokes the old ones")
	cmd.Flags().StringVar(&o.CAKey, "ca-key", "p256", "CA key type: p256 (every TLS stack and openssl take it) or ed25519 (signs node certificates for less CPU; Go clients, the agent and grpcurl take it)")
	_ = cmd.MarkFlagRequired("data-dir")
	return cmd
}

func serveCmd() *cobra.Command {
	var o daemon.ServeOptions
	var level, format string
	var providerFake bool
	var fakeState string
	cmd := &cobra.Command{
		Use:   "serve --data-dir DIR",
		Short: "Run the control plane",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := logger(level, format)
			if err != nil {
				return err
			}
			o.Log = log
			if providerFake {
				if fakeState == "" {
					fakeState = filepath.Join(o.DataDir, FakeMachinesFile)
				}
				p, err := fake.Open(fakeState)
				if err != nil {
					return fmt.Errorf("--provider-fake: %w", err)
				}
				log.Warn("the fake provider is enabled: for chaos runs and tests only", "state", fakeState)
				o.Providers = append(o.Providers, p)
			}
			if o.Store == "" {
				o.Store = os.Getenv("TETHER_STORE")
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			o.ReloadServerCert = onSIGHUP(ctx)
			return daemon.Serve(ctx, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.DataDir, "data-dir", "", "data directory made by `tetherd init` (required)")
	f.StringVar(&o.Listen, "listen", "127.0.0.1:7443", "gRPC listen address")
	f.StringVar(&o.Store, "store", "", "sqlite (default) or a postgres:// URL; also $TETHER_STORE")
	f.StringVar(&o.MetricsListen, "metrics-listen", "", "serve Prometheus metrics on this address at /metrics (off by default)")
	f.BoolVar(&o.Pprof, "pprof", false, "also serve /debug/pprof on --metrics-listen (off by default: profiles and goroutine dumps are for whoever reaches that address)")
	f.StringVar(&o.AgentURL, "agent-url", "", "control plane URL handed to agents (default https://10.0.2.2:PORT, the host as a QEMU guest sees it)")
	f.StringSliceVar(&o.SigningKeyFiles, "module-signing-key", nil, "Ed25519 public key files that module signatures may verify with")
	f.StringVar(&o.QEMUMode, "qemu-mode", "real", "qemu provider mode: real (boot VMs), recorder (record what it would do) or disabled")
	f.StringVar(&o.QEMUBoot, "qemu-boot", "direct", "how qemu VMs boot: direct (kernel, initramfs and token handed to QEMU), bios (SeaBIOS + the NIC's iPXE ROM) or uefi (OVMF); bios and uefi fetch everything over the network")
	f.BoolVar(&o.QEMUTPM, "qemu-tpm", false, "give every qemu VM a TPM 2.0 (tpm-crb, one swtpm per VM; needs the swtpm and swtpm-tools packages): the TPM is its node's, kept in QEMU-STATE/tpm/NODE across the node's instances")
	f.StringVar(&o.QEMUTap, "qemu-tap", "", "put qemu VMs on this tap device (a bridge port where tetherd's DHCP answers) instead of QEMU's user-mode network; one VM at a time")
	f.DurationVar(&o.RedfishGracefulTimeout, "redfish-graceful-timeout", 60*time.Second, "how long a redfish stop waits for a graceful shutdown before forcing the power off")
	f.DurationVar(&o.RedfishPowerTimeout, "redfish-power-timeout", 60*time.Second, "how long a redfish power action waits for the BMC's PowerState to show it")
	f.StringVar(&o.QEMUStateDir, "qemu-state-dir", "", "qemu VM state directory (default DATA/machines; QMP sockets live here, so keep it short)")
	f.StringVar(&o.Libvirt.URI, "libvirt-uri", "", "enable the libvirt provider on this libvirtd: qemu:///system, qemu:///session, qemu+unix:///system?socket=PATH, qemu+tcp://HOST/system or qemu+tls://HOST/system (off by default)")
	f.StringVar(&o.Libvirt.StateDir, "libvirt-state-dir", "", "libvirt provider state directory: console logs, and token files while a domain boots (default DATA/libvirt)")
	f.StringVar(&o.Libvirt.Boot, "libvirt-boot", "direct", "how libvirt domains boot: direct (kernel, initramfs and token handed to libvirtd; needs a local libvirtd) or network (the firmware's iPXE fetches everything from --netboot-listen)")
	f.StringVar(&o.Libvirt.Firmware, "libvirt-firmware", "bios", "libvirt domain firmware: bios (SeaBIOS) or uefi (OVMF, with a per-domain NVRAM removed on terminate)")
	f.BoolVar(&o.Libvirt.TPM, "libvirt-tpm", false, "give every libvirt domain a TPM 2.0 (<tpm model='tpm-crb'> with libvirtd's swtpm emulator)")
	f.StringVar(&o.Libvirt.Network, "libvirt-network", "user", "libvirt domain NIC: user (QEMU user-mode networking, the host is 10.0.2.2), network:NAME (a libvirt network) or bridge:NAME")
	f.StringVar(&o.Libvirt.DomainType, "libvirt-domain-type", "auto", "libvirt domain type: auto (kvm when libvirtd offers it, else qemu), kvm or qemu (TCG)")
	f.IntVar(&o.Libvirt.MemoryMiB, "libvirt-memory", 512, "libvirt domain memory in MiB")
	f.IntVar(&o.Libvirt.CPUs, "libvirt-cpus", 1, "libvirt domain vCPUs")
	f.StringVar(&o.Libvirt.FileOwner, "libvirt-file-owner", "", "give the files QEMU reads and writes in the libvirt state directory to this user (USER or UID:GID): the user libvirtd runs QEMU as, e.g. libvirt-qemu for Debian's qemu:///system (default: leave them tetherd's)")
	f.DurationVar(&o.Libvirt.StopGrace, "libvirt-stop-grace", 3*time.Second, "how long a libvirt stop waits after the ACPI power button before destroying the domain")
	f.StringVar(&o.Kernel, "kernel", "", "default netboot kernel (bzImage); stored content addressed in the data dir at start-up")
	f.StringVar(&o.Initramfs, "initramfs", "", "default netboot initramfs; stored content addressed in the data dir at start-up")
	f.StringVar(&o.NetbootListen, "netboot-listen", "", "serve kernels, initramfs and per-instance iPXE scripts over HTTP on this address (off by default)")
	f.BoolVar(&o.NetbootAnnounce, "netboot-announce", false, "boot a machine with an unknown hardware address into the agent, which announces its TPM's endorsement key for `tetherctl netboot seen` and `node adopt`, instead of refusing it (off by default: a refused machine falls back to its next boot device)")
	f.StringVar(&o.NetbootURL, "netboot-url", "", "netboot server URL as machines reach it (default http://10.0.2.2:PORT, or the --dhcp-interface address)")
	f.StringVar(&o.PXE.Interface, "dhcp-interface", "", "answer DHCP for netbooting machines on this interface (off by default; needs --netboot-listen)")
	f.StringVar(&o.PXE.Mode, "dhcp-mode", "", "proxy: boot information only, beside the site's DHCP server; full: also lease addresses from --dhcp-range")
	f.StringVar(&o.PXE.Range, "dhcp-range", "", "full mode: addresses to lease, FIRST-LAST, in the interface's subnet")
	f.StringVar(&o.PXE.Router, "dhcp-router", "", "full mode: default gateway handed out")
	f.StringVar(&o.PXE.DNS, "dhcp-dns", "", "full mode: DNS server handed out")
	f.StringVar(&o.PXE.IPXEDir, "ipxe-dir", "", "directory of the iPXE loaders undionly.kpxe, ipxe.efi, snponly.efi (default /usr/lib/ipxe, Debian's ipxe package)")
	f.StringVar(&o.PXE.TFTPListen, "tftp-listen", "", "serve the iPXE loaders over TFTP on this address (default the --dhcp-interface address, port 69)")
	f.Float64Var(&o.UnauthenticatedRate, "unauthenticated-rate", 20, "enrollments and netboot script requests allowed per second per source address, on average (negative: no limit)")
	f.IntVar(&o.UnauthenticatedBurst, "unauthenticated-burst", 200, "enrollments and netboot script requests allowed at once per source address")
	f.DurationVar(&o.SilentAfter, "silent-after", 0, "raise instance.silent after this long without a heartbeat (default 3m; stretches with fleet size)")
	f.DurationVar(&o.BootTimeout, "boot-timeout", 0, "error an instance whose boot makes no progress for this long (default 15m)")
	f.DurationVar(&o.SwitchTimeout, "switch-timeout", 0, "error a boot whose agent does not come back this long after switching into the root's init (default 3m)")
	f.DurationVar(&o.PresumedDeadAfter, "presumed-dead-after", 0, "error a silent instance whose machine is not running after this long (default 10m; stretches with fleet size)")
	f.DurationVar(&o.ProviderSyncEvery, "provider-sync-every", 0, "compare instances with the providers' machines this often (default 1m)")
	f.StringVar(&o.Replica, "replica-name", "", "this replica's name in agent presence; keep it stable across restarts (default HOSTNAME/LISTEN-ADDRESS)")
	f.DurationVar(&o.PresenceLease, "presence-lease", 0, "how long an agent stays claimable after the replica holding its stream stops renewing (a crash); default 15s")
	f.IntVar(&o.MaxAgentConnections, "max-agent-connections", 0, "refuse new connections at accept time past this many open (default: the descriptor limit minus --fd-reserve; -1: no cap)")
	f.IntVar(&o.FDReserve, "fd-reserve", daemon.DefaultFDReserve, "descriptors kept for the store, listeners and providers when deriving --max-agent-connections")
	f.IntVar(&o.MaxUnauthenticatedPerSource, "max-unauthenticated-per-source", daemon.DefaultMaxUnauthenticatedPerSource, "unauthenticated connections (handshaking, or without a CA-signed client certificate) one source address may hold; past it its oldest is closed for the new one (-1: no cap)")
	f.DurationVar(&o.UnauthenticatedAge, "unauthenticated-age", 0, "close a connection without a CA-signed client certificate this long after it was accepted (default 30s)")
	f.DurationVar(&o.HandshakeTimeout, "handshake-timeout", 0, "close a connection whose TLS and HTTP/2 handshakes take longer (default 5s)")
	f.DurationVar(&o.AgentSweep, "agent-sweep", 0, "look for agent tasks whose notification was lost this often, in one query (default 20s)")
	f.StringSliceVar(&o.SelfInstanceIDs, "self-instance", nil, "instance ids that host this control plane (drain refuses them)")
	f.BoolVar(&o.DisableAudit, "no-audit", false, "turn the audit trail off (only to measure its cost)")
	_ = f.MarkHidden("no-audit")
	f.BoolVar(&providerFake, "provider-fake", false, "TESTING ONLY (make chaos): add the in-memory fake provider, its machines kept in DATA/"+FakeMachinesFile+" with their tokens")
	f.StringVar(&fakeState, "provider-fake-state", "", "TESTING ONLY: the --provider-fake machine file (default DATA/"+FakeMachinesFile+"); replicas given one file share one machine list (it is flock'ed)")
	f.StringVar(&level, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&format, "log-format", "text", "text or json")
	_ = cmd.MarkFlagRequired("data-dir")
	return cmd
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

func renewServerCertCmd() *cobra.Command {
	var o daemon.RenewServerCertOptions
	cmd := &cobra.Command{
		Use:   "renew-server-cert --data-dir DIR",
		Short: "Issue a new server certificate under the data dir's CA; a running tetherd picks it up without a restart",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			hosts, until, err := daemon.RenewServerCert(o)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote a new server certificate for %v, valid until %s\n"+
				"  a running tetherd serves it within 10 s, or at once after: kill -HUP $(pidof tetherd)\n", hosts, until)
			return nil
		},
	}
	cmd.Flags().StringVar(&o.DataDir, "data-dir", "", "the data dir (required)")
	cmd.Flags().StringSliceVar(&o.Advertise, "advertise", nil, "extra host names or addresses for the certificate (it keeps those it has)")
	_ = cmd.MarkFlagRequired("data-dir")
	return cmd
}
