package tftp

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"pack.ag/tftp"
)

func TestServesOnlyLoadersReadOnly(t *testing.T) {
	dir := t.TempDir()
	loader := bytes.Repeat([]byte("undionly"), 1000) // several blocks
	for name, body := range map[string][]byte{"undionly.kpxe": loader, "ipxe.pxe": []byte("not served"), "secret": []byte("no")} {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	s := &Server{Loaders: Loaders{Dir: dir}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	go func() { done <- s.Serve(ctx, conn) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	c, err := tftp.NewClient(tftp.ClientTimeout(1))
	if err != nil {
		t.Fatal(err)
	}
	base := "tftp://" + conn.LocalAddr().String() + "/"

	resp, err := c.Get(base + "undionly.kpxe")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp)
	if err != nil || !bytes.Equal(got, loader) {
		t.Fatalf("loader: %d bytes, %v", len(got), err)
	}

	for _, name := range []string{"ipxe.pxe", "secret", "../" + filepath.Base(dir) + "/undionly.kpxe", "/etc/passwd", filepath.Join(dir, "undionly.kpxe"), "./undionly.kpxe", "", "ipxe.efi"} {
		t.Run("refuses "+name, func(t *testing.T) {
			resp, err := c.Get(base + name)
			if err == nil {
				b, rerr := io.ReadAll(resp)
				if rerr == nil {
					t.Fatalf("served %q: %q", name, b)
				}
			}
		})
	}
	err = c.Put(base+"undionly.kpxe", strings.NewReader("overwrite"), 9)
	if err == nil {
		t.Fatal("a write was accepted")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "undionly.kpxe")); !bytes.Equal(b, loader) {
		t.Fatal("a write changed the loader")
	}
}

func TestOpenRefusesEverythingButLoaders(t *testing.T) {
	l := Loaders{Dir: t.TempDir()}
	for _, name := range []string{"..", "../undionly.kpxe", "/undionly.kpxe", "undionly.kpxe/", "UNDIONLY.KPXE", "undionly.kpxe\x00", "ipxe.lkrn"} {
		if _, err := l.Open(name); err == nil {
			t.Errorf("Open(%q) succeeded", name)
		}
	}
	if err := l.Check(); err == nil {
		t.Fatal("Check accepted a directory without loaders")
	}
}
