package daemon

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/internal/uki"
)

// tetherd serve refuses --uki and Secure Boot flags that cannot work,
// before it answers anything.
func TestServeRefusesBadUKIFlags(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if err := Init(InitOptions{DataDir: dir}); err != nil {
		t.Fatal(err)
	}
	var image string
	if tools, err := uki.FindTools(false); err == nil {
		if _, err := os.Stat(uki.DefaultStub); err == nil {
			in := t.TempDir()
			k, i := filepath.Join(in, "k"), filepath.Join(in, "i")
			os.WriteFile(k, bytes.Repeat([]byte("K"), 4096), 0o644)
			os.WriteFile(i, bytes.Repeat([]byte("I"), 4096), 0o644)
			image = filepath.Join(in, "node.efi")
			if err := uki.Build(context.Background(), tools, uki.Spec{Kernel: k, Initramfs: i, Cmdline: "console=ttyS0"}, image); err != nil {
				t.Fatal(err)
			}
		}
	}
	tests := []struct {
		name            string
		o               ServeOptions
		netboot, builds bool // builds: needs a real image
		want            string
	}{
		{"not TEMPLATE=FILE", ServeOptions{UKIs: []string{"node.efi"}}, true, false, "want TEMPLATE=FILE"},
		{"missing image", ServeOptions{UKIs: []string{"web=/nonexistent/node.efi"}}, true, false, "--uki web=/nonexistent/node.efi"},
		{"image without a netboot server", ServeOptions{UKIs: []string{"web=" + image}}, false, true, "--uki needs --netboot-listen"},
		{"Secure Boot without UEFI", ServeOptions{Providers: ProviderOptions{QEMU: QEMUOptions{Mode: "recorder", SecureBoot: true}}}, false, false, "--qemu-secure-boot needs UEFI firmware"},
		{"unknown qemu boot", ServeOptions{Providers: ProviderOptions{QEMU: QEMUOptions{Mode: "recorder", Boot: "uefi-https"}}}, false, false, "direct, bios, uefi or uefi-http"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.builds && image == "" {
				msg := "SKIPPING " + t.Name() + ": no image to serve: binutils or systemd-boot-efi is missing"
				os.Stderr.WriteString(msg + "\n")
				t.Skip(msg)
			}
			o := tc.o
			o.DataDir, o.Log, o.Test.Listener = dir, slog.New(slog.NewTextHandler(io.Discard, nil)), mustListen(t)
			if o.Providers.QEMU.Mode != "" {
				o.Providers.QEMU.StateDir = t.TempDir()
			}
			if tc.netboot {
				o.Test.NetbootListener = mustListen(t)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := Serve(ctx, o); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Serve = %v, want an error about %q", err, tc.want)
			}
		})
	}
}
