package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/modulebuild"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// A stock Debian bookworm root, with nothing of Tether's in it: the agent
// must come back under Debian's systemd from the unit it writes in /run
// (docs/design.md §2.3). The tree is built once with mmdebstrap and cached
// under .cache/, like the kernel.

// debianBoot is generous: under TCG on a shared machine a systemd boot
// with udev's coldplug takes minutes, not seconds.
const debianBoot = 8 * time.Minute

// debianPackages are what a systemd root needs beyond minbase: systemd as
// init, iproute2 for a look at the network, udev so the serial console's
// device unit appears (without it systemd waits 90 s for it).
var debianPackages = []string{"systemd-sysv", "iproute2", "udev"}

// debianModule returns the Debian root as an lz4hc erofs image made by
// module build, building the tree and the image into .cache when absent. It skips loudly when
// mmdebstrap or mkfs.erofs cannot run.
func debianModule(t testing.TB) []byte {
	t.Helper()
	skip := func(format string, args ...any) {
		msg := "SKIP (Debian root e2e): " + fmt.Sprintf(format, args...)
		fmt.Fprintln(os.Stderr, msg)
		t.Skip(msg)
	}
	cache, err := filepath.Abs(filepath.Join("..", ".cache"))
	if err != nil {
		t.Fatal(err)
	}
	tree := filepath.Join(cache, "debian-root")
	image := filepath.Join(cache, "debian-root.erofs")
	if b, err := os.ReadFile(image); err == nil {
		return b
	}
	if _, err := os.Stat(filepath.Join(tree, "sbin", "init")); err != nil {
		if _, err := exec.LookPath("mmdebstrap"); err != nil {
			skip("mmdebstrap is not installed (apt-get install mmdebstrap), and %s is not built", tree)
		}
		tmp := tree + ".tmp"
		os.RemoveAll(tmp)
		cmd := exec.Command("mmdebstrap", "--variant=minbase", "--include="+strings.Join(debianPackages, ","), "bookworm", tmp)
		if out, err := cmd.CombinedOutput(); err != nil {
			os.RemoveAll(tmp)
			skip("mmdebstrap could not build the Debian root (it needs root or user namespaces, and Debian's package mirror): %v\n%s", err, tail(string(out), 2000))
		}
		if err := os.Rename(tmp, tree); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := exec.LookPath("mkfs.erofs"); err != nil {
		skip("mkfs.erofs is not installed (apt-get install erofs-utils)")
	}
	// Built as `tetherctl module build DIR debian:12` builds it, so the
	// boots below also prove what module build makes boots under systemd.
	tmp := image + ".tmp"
	if _, err := modulebuild.Build(context.Background(), modulebuild.Options{Source: tree, Out: tmp}); err != nil {
		os.Remove(tmp)
		t.Fatalf("module build %s: %v", tree, err)
	}
	if err := os.Rename(tmp, image); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(image)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// debianModulePath is debianModule's cached image, built when absent.
func debianModulePath(t testing.TB) string {
	t.Helper()
	debianModule(t)
	path, err := filepath.Abs(filepath.Join("..", ".cache", "debian-root.erofs"))
	if err != nil {
		t.Fatal(err)
	}
	return path
}

func newDebianEnv(t *testing.T, extra ...testcp.Option) *vmEnv {
	a := requireVM(t)
	data := debianModule(t)
	env := newRootEnv(t, a, "debian", data, extra...)
	env.bootWithin = debianBoot
	env.debian = data
	return env
}

func debianCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// waitConsole polls the console (QEMU writes it from another process) for
// every one of want.
func (e *vmEnv) waitConsole(t *testing.T, ctx context.Context, id string, within time.Duration, want ...string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		console := e.console(ctx, id)
		missing := ""
		for _, w := range want {
			if !strings.Contains(console, w) {
				missing = w
				break
			}
		}
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("console of %s lacks %q after %s:\n%s", id, missing, within, tail(console, 4000))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// checkSystemd: PID 1 is systemd, it answers, and it runs the agent from
// the unit the agent wrote.
func checkSystemd(t *testing.T, env *vmEnv, ctx context.Context, id string) {
	t.Helper()
	if got := strings.TrimSpace(env.exec(t, ctx, id, "cat", "/proc/1/comm")); got != "systemd" {
		t.Fatalf("PID 1 is %q, want systemd", got)
	}
	// is-system-running exits non-zero unless "running": "degraded" (a
	// unit of the stock image failed) and "starting" still answer.
	state := strings.TrimSpace(env.exec(t, ctx, id, "sh", "-c", "systemctl is-system-running; true"))
	switch state {
	case "running", "degraded", "starting", "initializing":
	default:
		t.Fatalf("systemctl is-system-running answered %q", state)
	}
	t.Logf("systemctl is-system-running: %s", state)
	if got := strings.TrimSpace(env.exec(t, ctx, id, "sh", "-c", "systemctl is-active tether-agent.service; true")); got != "active" {
		t.Fatalf("tether-agent.service is %q under systemd", got)
	}
	if got := env.exec(t, ctx, id, "cat", "/etc/os-release"); !strings.Contains(got, "ID=debian") {
		t.Fatalf("the root is not Debian's:\n%s", got)
	}
}

// TestVMDebianRoot: a stock Debian root boots to running with the agent
// back under its systemd, without a second enrollment, and an extension
// module attached; stop is an orderly systemd poweroff (the agent hears the
// ACPI button), and start, reboot and terminate are truthful.
func TestVMDebianRoot(t *testing.T) {
	env := newDebianEnv(t)
	ctx := debianCtx(t)
	hello, err := os.ReadFile(filepath.Join(filepath.Dir(env.a.rootModule), "tether-example-hello.erofs"))
	if err != nil {
		t.Fatal(err)
	}
	env.cp.PushModule(ctx, "hello", "1", hello)
	if _, err := env.cp.Admin.UpdateTemplate(ctx, &v1.UpdateTemplateRequest{Name: env.template, UpdateMask: []string{"extension_modules"},
		ExtensionModules: []*v1.ModuleRef{{Name: "hello", Version: "1"}}}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	id := env.provision(t, ctx)
	env.waitRunning(t, ctx, id, func(in *v1.Instance) bool { return len(in.RunningModuleDigests) == 2 })
	t.Logf("provision -> running (Debian, systemd) in %s", time.Since(start).Round(time.Second))
	env.waitConsole(t, ctx, id, 10*time.Second, "the root's init is systemd (/lib/systemd/systemd): it starts the next agent from /run/systemd/system/tether-agent.service")
	checkSystemd(t, env, ctx, id)
	if n := len(env.certs(t, ctx, id)); n != 1 {
		t.Fatalf("%d certificates: the agent under systemd must reuse the boot's identity, not enroll again", n)
	}
	// The extension is attached by the agent under systemd.
	if mounts := env.exec(t, ctx, id, "cat", "/proc/mounts"); !strings.Contains(mounts, "/run/tether/ext/hello erofs ro") {
		t.Fatalf("the extension is not attached under systemd:\n%s", mounts)
	}
	in, err := env.cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: id})
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(len(env.debian) + len(hello)); in.ModuleRamBytes != want {
		t.Fatalf("module RAM in the view = %d, want %d (the root and the extension)", in.ModuleRamBytes, want)
	}

	before := bootID(t, env, ctx, id)
	if _, err := env.cp.Admin.RebootInstance(ctx, &v1.InstanceActionRequest{Id: id}); err != nil {
		t.Fatal(err)
	}
	env.waitRunning(t, ctx, id, nil)
	if after := bootID(t, env, ctx, id); after == before {
		t.Fatalf("the machine did not reboot: boot id %s unchanged", after)
	}
	checkSystemd(t, env, ctx, id)

	stopStart := time.Now()
	if _, err := env.cp.Admin.StopInstance(ctx, &v1.InstanceActionRequest{Id: id}); err != nil {
		t.Fatal(err)
	}
	t.Logf("stop took %s", time.Since(stopStart).Round(time.Second))
	in, err = env.cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: id})
	if err != nil || in.Status != v1.InstanceStatus_INSTANCE_STATUS_STOPPED {
		t.Fatalf("after stop: %v %v", in.GetStatus(), err)
	}
	if pid := qemuPID(id); pid != "" {
		t.Fatalf("qemu still running after stop: pid %s", pid)
	}
	// Orderly: the agent heard the button and asked systemd, and the
	// kernel powered down at systemd's request (not QEMU quit).
	env.waitConsole(t, ctx, id, 10*time.Second, "power button pressed (ACPI): powering off through systemd", "reboot: Power down")

	if _, err := env.cp.Admin.StartInstance(ctx, &v1.InstanceActionRequest{Id: id}); err != nil {
		t.Fatal(err)
	}
	env.waitRunning(t, ctx, id, nil)
	checkSystemd(t, env, ctx, id)

	if _, err := env.cp.Admin.TerminateInstance(ctx, &v1.InstanceActionRequest{Id: id}); err != nil {
		t.Fatal(err)
	}
	if pid := qemuPID(id); pid != "" {
		t.Fatalf("qemu still running after terminate: pid %s", pid)
	}
	in, err = env.cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: id})
	if err != nil || in.Status != v1.InstanceStatus_INSTANCE_STATUS_TERMINATED {
		t.Fatalf("after terminate: %v %v", in.GetStatus(), err)
	}
}

// TestVMDebianPool: a warm pool of two Debian members becomes ready, a
// claimed member runs systemd, and the pool refills to two ready members
// behind the claim.
func TestVMDebianPool(t *testing.T) {
	env := newDebianEnv(t, testcp.With(func(o *daemon.ServeOptions) { o.Loops.PoolReaperEvery = 2 * time.Second }))
	ctx := debianCtx(t)
	waitReady := startPool(t, ctx, env.cp, "debian-pool", env.template, 2*debianBoot, time.Second)
	waitReady(2)
	claim, err := env.cp.Admin.AcquirePoolMember(ctx, &v1.AcquirePoolMemberRequest{PoolName: "debian-pool", AcquiredBy: "e2e", AcquiredFor: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	checkSystemd(t, env, ctx, claim.Instance.Id)
	p := waitReady(2)
	if p.Counts.GetClaimed() != 1 {
		t.Fatalf("after the refill: %+v, want the claim kept", p.Counts)
	}
	for _, m := range p.Members {
		if m.InstanceId == claim.Instance.Id && m.PoolState != v1.PoolState_POOL_STATE_CLAIMED {
			t.Fatalf("the claimed member is counted as %v", m.PoolState)
		}
	}
}
