package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// TestVMRootWithoutHookErrorsAfterTheSwitchTimeout: a busybox root whose
// inittab does not start the agent. The console says what the root must
// do, and the instance errors after the switch timeout, not after the
// 15-minute boot timeout.
func TestVMRootWithoutHookErrorsAfterTheSwitchTimeout(t *testing.T) {
	a := requireVM(t)
	busybox, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skipf("SKIP: no /bin/busybox to build a root without the hook (apt-get install busybox-static): %v", err)
	}
	if _, err := exec.LookPath("mkfs.erofs"); err != nil {
		t.Skip("SKIP: mkfs.erofs is not installed (apt-get install erofs-utils)")
	}
	tree := t.TempDir()
	for _, d := range []string{"bin", "sbin", "etc", "proc", "sys", "dev", "run", "tmp"} {
		if err := os.MkdirAll(filepath.Join(tree, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(tree, "bin", "busybox"), busybox, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../bin/busybox", filepath.Join(tree, "sbin", "init")); err != nil {
		t.Fatal(err)
	}
	inittab := "::sysinit:/bin/busybox echo ROOT_WITHOUT_AGENT_HOOK\n::respawn:/bin/busybox sleep 3600\n"
	if err := os.WriteFile(filepath.Join(tree, "etc", "inittab"), []byte(inittab), 0o644); err != nil {
		t.Fatal(err)
	}
	image := filepath.Join(t.TempDir(), "nohook.erofs")
	if out, err := exec.Command("mkfs.erofs", image, tree).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.erofs: %v\n%s", err, out)
	}
	data, err := os.ReadFile(image)
	if err != nil {
		t.Fatal(err)
	}
	const switchTimeout = 20 * time.Second
	env := newRootEnv(t, a, "nohook", data, testcp.With(func(o *daemon.ServeOptions) { o.Liveness.SwitchTimeout = switchTimeout }))
	ctx := vmCtx(t)
	id := env.provision(t, ctx)
	env.waitConsole(t, ctx, id, bootTimeout, "the root's init is /bin/busybox (not systemd): the root must start and restart", "ROOT_WITHOUT_AGENT_HOOK")
	switched := time.Now()
	deadline := switched.Add(switchTimeout + time.Minute)
	for {
		in, err := env.cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: id})
		if err == nil && in.Status == v1.InstanceStatus_INSTANCE_STATUS_ERROR {
			if !strings.Contains(in.ErrorMessage, "did not come back after switching into the root's init") {
				t.Fatalf("errored for another reason: %q", in.ErrorMessage)
			}
			t.Logf("errored %s after the switch: %s", time.Since(switched).Round(time.Second), in.ErrorMessage)
			return
		}
		if err == nil && in.Status == v1.InstanceStatus_INSTANCE_STATUS_RUNNING {
			t.Fatal("an instance whose root started no agent is running")
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %v (phase %v) %s after the switch; the switch timeout is %s", in.GetStatus(), in.GetAgentPhase(), time.Since(switched).Round(time.Second), switchTimeout)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
