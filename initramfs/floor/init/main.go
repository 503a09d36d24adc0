// Command init is the bare-netboot floor: the least a Go /init can do to
// boot a node from the network, with the same packages the agent uses
// (agent/boot, agent/rootfs). It mounts the pseudo filesystems, loads the
// modules, configures the network from ip=, downloads one root module over
// HTTP while hashing it, composes the root (loop + erofs + overlay) and
// switches into it. initramfs/floor/run.sh times it in QEMU; that time is
// the floor the agent's own boot is measured against.
//
// Kernel command line:
//
//	floor.url=http://10.0.2.2:PORT/root.erofs   the module
//	floor.sha256=HEX                             its digest
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherfleet/tether/agent/boot"
	"github.com/tetherfleet/tether/agent/rootfs"
)

func main() {
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "floor: not PID 1; this is an initramfs /init")
		os.Exit(2)
	}
	if err := run(logf); err != nil {
		logf("FAILED: %v", err)
		// Power off rather than exit: PID 1 exiting panics the kernel, and
		// the harness wants QEMU to stop either way.
		unix.Sync()
		time.Sleep(200 * time.Millisecond)
		_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
		select {}
	}
}

// logf prefixes the time since boot, comparable with the kernel's own
// timestamps, so each phase can be read off the console.
func logf(format string, args ...any) {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	fmt.Printf("[%5d.%06d] floor: %s\n", ts.Sec, ts.Nsec/1000, fmt.Sprintf(format, args...))
}

func run(logf func(string, ...any)) error {
	logf("/init started")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := boot.Setup(ctx, boot.Config{Logf: logf}); err != nil {
		return err
	}
	b, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return err
	}
	cmdline := string(b)
	url, ok := boot.CmdlineValue(cmdline, "floor.url")
	if !ok {
		return errors.New("no floor.url= on the kernel command line")
	}
	want, ok := boot.CmdlineValue(cmdline, "floor.sha256")
	if !ok || len(want) != 64 {
		return errors.New("no floor.sha256=<64 hex digits> on the kernel command line")
	}
	want = strings.ToLower(want)

	path := filepath.Join("/run/tether/modules", want+".erofs")
	n, err := fetch(ctx, url, path, want)
	if err != nil {
		return err
	}
	logf("fetched %s (%d bytes), sha256 verified", url, n)

	sys := rootfs.RealSys()
	if _, err := rootfs.Compose(sys, []rootfs.Layer{{Name: "root", Path: path}}, "/run/tether/rootfs", "/newroot"); err != nil {
		return err
	}
	logf("root composed")
	return rootfs.Switch(sys, "/newroot", rootfs.SwitchOptions{Logf: logf})
}

// fetch streams url into path, hashing on the way, and removes the file if
// the digest is not the one asked for.
func fetch(ctx context.Context, url, path, want string) (int64, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("fetch: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("fetch %s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), resp.Body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		if got := hex.EncodeToString(h.Sum(nil)); got != want {
			err = fmt.Errorf("sha256 mismatch: got %s, want %s", got, want)
		}
	}
	if err != nil {
		os.Remove(path)
		return 0, fmt.Errorf("fetch %s: %w", url, err)
	}
	return n, nil
}
