// Package libvirttest starts a private libvirtd for tests that run real
// domains: a session-mode daemon whose configuration, sockets, logs and
// domain definitions all live in one temporary directory, and which the
// test stops and removes. It touches nothing of the host's libvirtd (no
// systemd, no /etc/libvirt, no libvirt network, so no bridge and no DHCP
// server): domains get QEMU's user-mode network.
//
// libvirtd run as root is the system daemon, with paths fixed at build
// time; so when the test runs as root the daemon runs as nobody, in
// session mode, and QEMU with it. The files QEMU reads must then be
// readable by nobody: Owner is what the provider's FileOwner must be, and
// the provider then stages its own copies.
//
// It is an ordinary package (not a _test file) so that the benchmark in
// e2e can use it too. Without libvirtd or QEMU it skips loudly, naming
// the package to install.
package libvirttest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"

	"github.com/tetherfleet/tether/providers/qemu/qemutest"
)

// nobody is the user the daemon runs as when the test is root.
const nobody = 65534

// Daemon is a running private libvirtd.
type Daemon struct {
	// Dir holds everything of the daemon's; StateDir is a directory in it
	// for the provider's instance directories.
	Dir, StateDir string
	// Socket is libvirtd's unix socket; URI opens its session driver.
	Socket, URI string
	// Owner is the provider's FileOwner: "UID:GID" of the daemon's user,
	// "" when the daemon runs as the test's own user.
	Owner string
	uid   int
	cmd   *exec.Cmd
	done  chan struct{}
	log   string
}

// Start starts a private libvirtd and stops it (and every domain it runs)
// when the test ends.
func Start(tb testing.TB) *Daemon {
	tb.Helper()
	bin, err := exec.LookPath("libvirtd")
	if err != nil {
		for _, p := range []string{"/usr/sbin/libvirtd", "/sbin/libvirtd"} {
			if _, serr := os.Stat(p); serr == nil {
				bin, err = p, nil
				break
			}
		}
	}
	if err != nil {
		qemutest.SkipLoudly(tb, "libvirtd not found (install the libvirt-daemon and libvirt-daemon-driver-qemu packages): %v", err)
	}
	qemutest.RequireQEMU(tb)

	// Short, since libvirtd's monitor sockets live under it and a unix
	// socket path has 107 bytes; and every parent must let nobody pass:
	// /tmp is both, a deep or private $TMPDIR may be neither.
	base := os.TempDir()
	if len(base) > 40 || (os.Geteuid() == 0 && !othersPass(base)) {
		base = "/tmp"
	}
	dir, err := os.MkdirTemp(base, "lvt")
	if err != nil {
		tb.Fatal(err)
	}
	d := &Daemon{Dir: dir, StateDir: filepath.Join(dir, "state"), uid: os.Geteuid(), done: make(chan struct{}),
		log: filepath.Join(dir, "libvirtd.log")}
	home, run := filepath.Join(dir, "home"), filepath.Join(dir, "run")
	cfgDir := filepath.Join(home, ".config", "libvirt")
	for _, p := range []string{cfgDir, run} {
		if err := os.MkdirAll(p, 0o700); err != nil {
			tb.Fatal(err)
		}
	}
	// QEMU's stdout goes to a plain file rather than through virtlogd,
	// which would be one more daemon to find and stop.
	if err := os.WriteFile(filepath.Join(cfgDir, "qemu.conf"), []byte("stdio_handler = \"file\"\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	// One client (the test), no idle timeout of its own: the test stops it.
	if err := os.WriteFile(filepath.Join(cfgDir, "libvirtd.conf"), []byte("log_outputs = \"3:stderr\"\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	if d.uid == 0 {
		d.uid = nobody
		d.Owner = fmt.Sprintf("%d:%d", nobody, nobody)
		if err := chownTree(dir, nobody, nobody); err != nil {
			tb.Fatal(err)
		}
		// The test (root) reads the console logs nobody's QEMU writes.
		if err := os.Chmod(dir, 0o711); err != nil {
			tb.Fatal(err)
		}
	}
	d.Socket = filepath.Join(run, "libvirt", "libvirt-sock")
	d.URI = "qemu+unix:///session?socket=" + d.Socket

	logf, err := os.Create(d.log)
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Dir = dir
	cmd.Env = []string{
		"HOME=" + home, "XDG_RUNTIME_DIR=" + run,
		"XDG_CONFIG_HOME=" + filepath.Join(home, ".config"), "XDG_CACHE_HOME=" + filepath.Join(home, ".cache"),
		"XDG_DATA_HOME=" + filepath.Join(home, ".local", "share"),
		"PATH=/usr/sbin:/usr/bin:/sbin:/bin",
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if d.Owner != "" {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: nobody, Gid: nobody, Groups: []uint32{}}
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		os.RemoveAll(dir)
		tb.Fatalf("start libvirtd: %v", err)
	}
	logf.Close()
	d.cmd = cmd
	go func() { _ = cmd.Wait(); close(d.done) }()
	tb.Cleanup(func() { d.stop(tb) })

	// Polled with a deadline: libvirtd says nothing when it is ready
	// except by answering on its socket.
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("unix", d.Socket, time.Second)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-d.done:
			tb.Fatalf("libvirtd exited during start-up: %s", d.LogTail())
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("libvirtd did not open %s within 30 s: %v; log: %s", d.Socket, err, d.LogTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := os.MkdirAll(d.StateDir, 0o711); err != nil {
		tb.Fatal(err)
	}
	return d
}

// othersPass reports whether every directory from dir up is searchable by
// any user.
func othersPass(dir string) bool {
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		if d == filepath.Dir(d) {
			return true
		}
	}
}

func chownTree(dir string, uid, gid int) error {
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

// Connect opens a go-libvirt connection to the daemon, for tests that
// look behind the provider's back (or plant a domain of their own).
func (d *Daemon) Connect(tb testing.TB) *golibvirt.Libvirt {
	tb.Helper()
	l := golibvirt.NewWithDialer(dialers.NewLocal(dialers.WithSocket(d.Socket), dialers.WithLocalTimeout(5*time.Second)))
	if err := l.ConnectToURI(golibvirt.QEMUSession); err != nil {
		tb.Fatalf("connect to the test libvirtd: %v", err)
	}
	tb.Cleanup(func() { _ = l.Disconnect() })
	return l
}

// LogTail is the end of the daemon's log.
func (d *Daemon) LogTail() string {
	b, err := os.ReadFile(d.log)
	if err != nil {
		return "(no libvirtd log)"
	}
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return strings.TrimSpace(string(b))
}

// stop destroys every domain, stops the daemon and removes its directory.
// A QEMU that outlives all that is killed by the pid file libvirtd wrote.
func (d *Daemon) stop(tb testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.destroyAll(ctx); err != nil {
		tb.Logf("libvirttest: destroying the domains: %v", err)
	}
	if tb.Failed() {
		tb.Logf("libvirtd log (tail):\n%s", d.LogTail())
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(15 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.done
	}
	for _, pid := range d.qemuPIDs() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if err := os.RemoveAll(d.Dir); err != nil {
		tb.Logf("libvirttest: remove %s: %v", d.Dir, err)
	}
}

func (d *Daemon) destroyAll(ctx context.Context) error {
	l := golibvirt.NewWithDialer(dialers.NewLocal(dialers.WithSocket(d.Socket), dialers.WithLocalTimeout(5*time.Second)))
	if err := l.ConnectToURI(golibvirt.QEMUSession); err != nil {
		return err
	}
	defer l.Disconnect()
	ds, _, err := l.ConnectListAllDomains(1, golibvirt.ConnectListDomainsActive|golibvirt.ConnectListDomainsInactive)
	if err != nil {
		return err
	}
	var errs []error
	for _, dom := range ds {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := l.DomainDestroy(dom); err != nil && !errors.Is(err, golibvirt.ErrInterrupted) {
			var le golibvirt.Error
			if !errors.As(err, &le) || golibvirt.ErrorNumber(le.Code) != golibvirt.ErrOperationInvalid {
				errs = append(errs, fmt.Errorf("destroy %s: %w", dom.Name, err))
			}
		}
		if err := l.DomainUndefineFlags(dom, golibvirt.DomainUndefineNvram); err != nil {
			errs = append(errs, fmt.Errorf("undefine %s: %w", dom.Name, err))
		}
	}
	return errors.Join(errs...)
}

// qemuPIDs reads the pid files of the daemon's running domains.
func (d *Daemon) qemuPIDs() []int {
	files, _ := filepath.Glob(filepath.Join(d.Dir, "run", "libvirt", "qemu", "run", "*.pid"))
	var out []int
	for _, f := range files {
		if filepath.Base(f) == "driver.pid" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
			out = append(out, pid)
		}
	}
	return out
}

// DomainNames lists the names of the daemon's domains, active or not.
func (d *Daemon) DomainNames(tb testing.TB) []string {
	tb.Helper()
	l := d.Connect(tb)
	ds, _, err := l.ConnectListAllDomains(1, golibvirt.ConnectListDomainsActive|golibvirt.ConnectListDomainsInactive)
	if err != nil {
		tb.Fatalf("list domains: %v", err)
	}
	var names []string
	for _, dom := range ds {
		names = append(names, dom.Name)
	}
	return names
}
