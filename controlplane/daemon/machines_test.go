package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/controlplane/bmc"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/external"
	"github.com/tetherfleet/tether/providers/fake"
	"github.com/tetherfleet/tether/providers/qemu"
	"github.com/tetherfleet/tether/providers/redfish"
)

func TestBuildProviders(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	tests := []struct {
		name     string
		opts     ServeOptions
		wantErr  string
		wantMode qemu.Mode
		wantFake bool
	}{
		{"recorder", ServeOptions{DataDir: dir, Providers: ProviderOptions{QEMU: QEMUOptions{Mode: "recorder"}}}, "", qemu.ModeRecorder, false},
		{"disabled", ServeOptions{DataDir: dir, Providers: ProviderOptions{QEMU: QEMUOptions{Mode: "disabled"}}}, "", qemu.ModeDisabled, false},
		{"unknown mode refuses to start", ServeOptions{DataDir: dir, Providers: ProviderOptions{QEMU: QEMUOptions{Mode: "local"}}}, `unknown mode "local"`, "", false},
		{"tests inject the fake", ServeOptions{DataDir: dir, Providers: ProviderOptions{QEMU: QEMUOptions{Mode: "disabled"}}, Test: TestHooks{Providers: []providers.Provider{fake.New()}}}, "", qemu.ModeDisabled, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ps, err := buildProviders(tc.opts, log, clock.Real{}, &bmc.Resolver{})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := ps[external.Name]; !ok {
				t.Fatal("no external provider")
			}
			if _, ok := ps[redfish.Name].(*redfish.Provider); !ok {
				t.Fatal("no redfish provider")
			}
			q, ok := ps[qemu.Name].(*qemu.Provider)
			if !ok || q.Mode() != tc.wantMode {
				t.Fatalf("qemu provider %v", ps[qemu.Name])
			}
			if _, ok := ps[fake.Name]; ok != tc.wantFake {
				t.Fatalf("fake provider present: %v", ok)
			}
		})
	}
}

func TestServeRefusesAnUnknownQEMUMode(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if err := Init(InitOptions{DataDir: dir}); err != nil {
		t.Fatal(err)
	}
	err := Serve(context.Background(), ServeOptions{DataDir: dir, Listeners: ListenOptions{GRPC: "127.0.0.1:0"}, Providers: ProviderOptions{QEMU: QEMUOptions{Mode: "bogus"}},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err == nil || !strings.Contains(err.Error(), "--qemu-mode") {
		t.Fatalf("serve with --qemu-mode bogus: %v", err)
	}
}

func TestServeRefusesAMissingKernel(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if err := Init(InitOptions{DataDir: dir}); err != nil {
		t.Fatal(err)
	}
	err := Serve(context.Background(), ServeOptions{DataDir: dir, Listeners: ListenOptions{GRPC: "127.0.0.1:0"}, Providers: ProviderOptions{QEMU: QEMUOptions{Mode: "disabled"}},
		Kernel: filepath.Join(dir, "no-such-bzImage"), Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err == nil || !strings.Contains(err.Error(), "--kernel") || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("serve with a missing kernel: %v", err)
	}
}

func TestBuildProvidersLibvirt(t *testing.T) {
	dir := t.TempDir()
	// A socket nobody listens on: the provider is built, and the probe's
	// failure is a warning, not a refusal to start.
	absent := "qemu+unix:///system?socket=" + filepath.Join(dir, "no-libvirtd.sock")
	tests := []struct {
		name    string
		lo      LibvirtOptions
		wantErr string
		want    bool
		wantLog string
	}{
		{name: "off unless a URI is given", want: false},
		{name: "on with a URI, libvirtd away", lo: LibvirtOptions{URI: absent}, want: true, wantLog: "libvirtd does not answer"},
		{name: "bad boot", lo: LibvirtOptions{URI: absent, Boot: "pxe"}, wantErr: "--libvirt-boot"},
		{name: "bad firmware", lo: LibvirtOptions{URI: absent, Firmware: "coreboot"}, wantErr: "--libvirt-firmware"},
		{name: "bad network", lo: LibvirtOptions{URI: absent, Network: "tap:tap0"}, wantErr: "--libvirt-network"},
		{name: "bad URI", lo: LibvirtOptions{URI: "xen:///system"}, wantErr: "only the qemu driver"},
		{name: "direct boot on a remote libvirtd", lo: LibvirtOptions{URI: "qemu+tcp://lab1/system"}, wantErr: "local libvirtd"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var logs strings.Builder
			log := slog.New(slog.NewTextHandler(&logs, nil))
			ps, err := buildProviders(ServeOptions{DataDir: dir, Providers: ProviderOptions{QEMU: QEMUOptions{Mode: "disabled"}, Libvirt: tc.lo}}, log, clock.Real{}, &bmc.Resolver{})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := ps["libvirt"]; ok != tc.want {
				t.Fatalf("libvirt provider present: %v, want %v", ok, tc.want)
			}
			if !strings.Contains(logs.String(), tc.wantLog) {
				t.Fatalf("log lacks %q:\n%s", tc.wantLog, logs.String())
			}
			if tc.want {
				if fi, err := os.Stat(filepath.Join(dir, LibvirtDir)); err != nil || !fi.IsDir() {
					t.Fatalf("default state dir DATA/%s: %v", LibvirtDir, err)
				}
			}
		})
	}
}

// --qemu-tpm without swtpm stops tetherd at start-up, naming what to
// install, rather than failing every boot later.
func TestBuildProvidersQEMUTPMNeedsSwtpm(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	t.Setenv("PATH", t.TempDir())
	_, err := buildProviders(ServeOptions{DataDir: dir, Providers: ProviderOptions{QEMU: QEMUOptions{Mode: "real", TPM: true}}}, log, clock.Real{}, &bmc.Resolver{})
	if err == nil || !strings.Contains(err.Error(), "swtpm") || !strings.Contains(err.Error(), "--qemu-tpm") {
		t.Fatalf("err %v, want one naming swtpm and --qemu-tpm", err)
	}
	ps, err := buildProviders(ServeOptions{DataDir: dir, Providers: ProviderOptions{QEMU: QEMUOptions{Mode: "recorder", TPM: true}}}, log, clock.Real{}, &bmc.Resolver{})
	if err != nil {
		t.Fatalf("recorder with --qemu-tpm: %v", err)
	}
	if q := ps[qemu.Name].(*qemu.Provider); !q.TPM() {
		t.Fatal("qemu provider has no TPM")
	}
}
