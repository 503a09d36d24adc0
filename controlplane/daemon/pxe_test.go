package daemon

import (
	"context"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/netboot/pxe"
)

// tetherd serve refuses DHCP flag combinations that cannot work, before
// it answers anything.
func TestServeRefusesBadDHCPFlags(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if err := Init(InitOptions{DataDir: dir}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		pxe     pxe.Options
		netboot bool
		want    string
	}{
		{"range without interface", pxe.Options{Range: "10.0.0.5-10.0.0.9"}, true, "--dhcp-range need --dhcp-interface"},
		{"interface without mode", pxe.Options{Interface: "lo"}, true, "needs --dhcp-mode"},
		{"interface without netboot server", pxe.Options{Interface: "lo", Mode: "proxy"}, false, "needs --netboot-listen"},
		{"no loaders", pxe.Options{Interface: "lo", Mode: "proxy", IPXEDir: t.TempDir()}, true, "install Debian's ipxe package"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := ServeOptions{DataDir: dir, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Listeners: ListenOptions{PXE: tc.pxe},
				Test: TestHooks{Listener: mustListen(t)}}
			if tc.netboot {
				o.Test.NetbootListener = mustListen(t)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := Serve(ctx, o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Serve = %v, want an error about %q", err, tc.want)
			}
		})
	}
}

func mustListen(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}
