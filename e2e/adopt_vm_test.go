package e2e

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/swtpmtest"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
	"github.com/tetherfleet/tether/providers/qemu"
)

// TestVMAdoptByAnnouncedEK is adoption on first sight (docs/adr/0030) on a
// real VM with its own swtpm, started by the test and unknown to tetherd:
// its firmware netboots, tetherd boots it to announce itself, it shows up
// with its EK, an admin adopts it, and an external provision of the
// adopted node makes it reboot into its boot and reach running with no
// token anywhere.
func TestVMAdoptByAnnouncedEK(t *testing.T) {
	swtpmtest.Require(t)
	const mac = "52:54:00:ad:0e:01"
	netLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	env := newNetbootEnv(t, "bios", "", testcp.With(func(o *daemon.ServeOptions) {
		o.Test.NetbootListener, o.Listeners.NetbootAnnounce = netLis, true
	}))
	ctx := vmCtx(t)
	_, port, _ := net.SplitHostPort(netLis.Addr().String())

	// The machine: a TPM of its own and a NIC whose iPXE asks the boot
	// route by MAC, as bare metal under SeaBIOS does.
	dir, err := os.MkdirTemp("", "tadopt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ek, err := qemu.PrepareTPM(filepath.Join(dir, "tpm"))
	if err != nil {
		t.Fatal(err)
	}
	sock, console := filepath.Join(dir, "swtpm.sock"), filepath.Join(dir, "console.log")
	startProcess(t, "swtpm", "socket", "--tpm2", "--tpmstate", "dir="+filepath.Join(dir, "tpm", "state"), "--ctrl", "type=unixio,path="+sock)
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("swtpm did not listen")
		}
		time.Sleep(20 * time.Millisecond)
	}
	accel := "tcg"
	if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err == nil {
		f.Close()
		accel = "kvm"
	}
	// No -no-reboot: the agent's reboot must take the machine back
	// through its firmware, as a real one's does.
	startProcess(t, "qemu-system-x86_64", "-M", "q35", "-accel", accel, "-cpu", "max", "-m", "1024", "-smp", "2",
		"-nodefaults", "-nographic",
		"-netdev", "user,id=n0,bootfile=http://10.0.2.2:"+port+"/ipxe/boot?mac="+mac,
		"-device", "virtio-net-pci,netdev=n0,mac="+mac, "-device", "virtio-rng-pci", "-boot", "n",
		"-chardev", "file,id=ser0,path="+console, "-serial", "chardev:ser0",
		"-chardev", "socket,id=chrtpm,path="+sock, "-tpmdev", "emulator,id=tpm0,chardev=chrtpm", "-device", "tpm-crb,tpmdev=tpm0")
	readConsole := func() string { b, _ := os.ReadFile(console); return string(b) }

	// It announces itself.
	var announced *v1.FleetEvent
	for deadline := time.Now().Add(bootTimeout); announced == nil && time.Now().Before(deadline); time.Sleep(time.Second) {
		for _, e := range env.events(t, ctx, "netboot.announced", "") {
			if e.Payload.AsMap()["mac"] == mac {
				announced = e
			}
		}
	}
	if announced == nil {
		t.Fatalf("the unknown machine did not announce itself\nconsole:\n%s", tail(readConsole(), 4000))
	}
	if got := announced.Payload.AsMap()["ek"]; got != ek {
		t.Fatalf("announced EK %v, want the VM's TPM's %s", got, ek)
	}
	if c := readConsole(); !strings.Contains(c, "this machine's TPM endorsement key is "+ek) || !strings.Contains(c, "tetherctl node adopt "+mac) {
		t.Errorf("the console does not show the key and the adopt command:\n%s", tail(c, 3000))
	}

	tpl, err := env.cp.Admin.GetNode(ctx, &v1.GetNodeRequest{Name: env.node})
	if err != nil {
		t.Fatal(err)
	}
	res, err := env.cp.Admin.AdoptNode(ctx, &v1.AdoptNodeRequest{Mac: mac, Template: tpl.TemplateName, Name: "adopted"})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Created || !res.Announced || strings.Join(res.Node.EkHashes, ",") != ek {
		t.Fatalf("adopted %v", res)
	}
	prov, err := env.cp.Admin.ProvisionInstance(ctx, &v1.ProvisionInstanceRequest{Node: "adopted", Provider: "external"})
	if err != nil {
		t.Fatal(err)
	}
	if prov.BootstrapToken != "" {
		t.Fatal("the adopted node's instance was given a token")
	}
	id := prov.Instance.Id
	in := env.waitRunningOr(t, ctx, id, readConsole)
	if in.Status != v1.InstanceStatus_INSTANCE_STATUS_RUNNING {
		t.Fatalf("instance %s is %v", id, in.Status)
	}
	if got := env.events(t, ctx, "enroll.succeeded", id); len(got) != 1 || !strings.Contains(got[0].Message, "TPM attestation (EK "+ek+")") {
		t.Fatalf("enroll.succeeded events %v, want one by attestation with EK %s", got, ek)
	}
	c := readConsole()
	for _, want := range []string{"rebooting", "by TPM attestation"} {
		if !strings.Contains(c, want) {
			t.Errorf("console lacks %q:\n%s", want, tail(c, 4000))
		}
	}
	if strings.Contains(c, "tether.token=") {
		t.Errorf("a token reached the machine:\n%s", tail(c, 4000))
	}
}

// waitRunningOr waits for id to run, showing the machine's own console
// (a VM the provider did not start has none in tetherd) on failure.
func (e *vmEnv) waitRunningOr(t *testing.T, ctx context.Context, id string, console func() string) *v1.Instance {
	t.Helper()
	deadline := time.Now().Add(bootTimeout + time.Minute)
	for time.Now().Before(deadline) {
		in, err := e.cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: id})
		if err == nil && in.Status == v1.InstanceStatus_INSTANCE_STATUS_RUNNING {
			return in
		}
		time.Sleep(time.Second)
	}
	t.Fatalf("instance %s did not reach running\nconsole:\n%s", id, tail(console(), 6000))
	return nil
}

// startProcess runs argv until the test ends, in its own process group,
// which is killed at the end.
func startProcess(t *testing.T, argv ...string) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := os.CreateTemp("", "proc-*.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", argv[0], err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		out.Close()
		os.Remove(out.Name())
	})
}
