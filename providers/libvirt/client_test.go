package libvirt

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/providers"
)

// silentLibvirtd accepts connections and never answers, like a libvirtd
// that hangs; it returns the socket's path.
func silentLibvirtd(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "lvs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var conns []net.Conn
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	})
	return sock
}

// A libvirtd that does not answer fails the operation as retryable when
// the session's deadline passes, instead of hanging the caller.
func TestHungLibvirtdFailsTheOperation(t *testing.T) {
	sock := silentLibvirtd(t)
	p, err := New(Config{URI: "qemu+unix:///system?socket=" + sock, StateDir: t.TempDir(), CallTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Status(context.Background(), "i-1")
	if providers.KindOf(err) != providers.KindTransient || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), sock) {
		t.Fatalf("status on a hung libvirtd = %v, want transient, past its deadline, naming the socket", err)
	}
	// The caller's own, earlier deadline wins too.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.List(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("list with a cancelled context = %v", err)
	}
}

func TestAbsentLibvirtdIsTransient(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none")
	p, err := New(Config{URI: "qemu+unix:///system?socket=" + sock, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Check(context.Background())
	if providers.KindOf(err) != providers.KindTransient || !strings.Contains(err.Error(), sock) {
		t.Fatalf("check with no libvirtd = %v, want transient naming the socket", err)
	}
}
