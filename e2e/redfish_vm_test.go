package e2e

import (
	"context"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/qemu"
	"github.com/tetherfleet/tether/providers/redfish"
	"github.com/tetherfleet/tether/providers/redfish/redfishtest"
)

// redfishVM is a control plane whose node's BMC is a test BMC driving a
// real QEMU VM in bios mode (SeaBIOS and the NIC's iPXE over user-mode
// networking), as a rack server's BMC drives the server: the VM gets
// nothing from Tether but what its firmware fetches by MAC.
type redfishVM struct {
	*vmEnv
	bmc *redfishtest.BMC
	vm  *redfishtest.QEMUMachine
}

func newRedfishVM(t testing.TB, mac string) *redfishVM {
	t.Helper()
	a := requireVM(t)
	requireFiles(t, map[string]string{ipxeROM: "ipxe-qemu"})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cp := testcp.Start(t, testcp.With(func(o *daemon.ServeOptions) {
		// tetherd's own qemu provider boots nothing here: the BMC's does.
		o.Providers.QEMU.Mode, o.Kernel, o.Initramfs, o.Test.NetbootListener = "disabled", a.kernel, a.initramfs, lis
		// A test BMC answers a power-on once QEMU is up: slow under TCG.
		o.Providers.Redfish.GracefulTimeout, o.Providers.Redfish.PowerTimeout, o.Providers.Redfish.RequestTimeout = 10*time.Second, 90*time.Second, 2*time.Minute
	}))
	stateDir, err := os.MkdirTemp("", "trf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(stateDir) })
	bq, err := qemu.New(qemu.Config{Mode: qemu.ModeReal, StateDir: stateDir, Boot: qemu.BootBIOS, StopGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(lis.Addr().String())
	vm := &redfishtest.QEMUMachine{P: bq, ID: "bmc-" + strings.ReplaceAll(mac, ":", ""), MAC: mac,
		Boot: providers.Boot{KernelURL: "http://10.0.2.2:" + port + "/"}}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := vm.Destroy(ctx); err != nil {
			t.Errorf("cleanup: destroy the BMC's VM: %v", err)
		}
	})
	b := redfishtest.New(t, redfishtest.Options{Username: "tether", Password: bmcPassword})
	b.AddSystem("1", vm)
	ctx := context.Background()
	data, err := os.ReadFile(a.rootModule)
	if err != nil {
		t.Fatal(err)
	}
	cp.PushModule(ctx, "example", "1", data)
	if _, err := cp.Admin.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: "bm", RootModules: []*v1.ModuleRef{{Name: "example", Version: "1"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Admin.CreateCredential(ctx, &v1.CreateCredentialRequest{Name: "rack", Username: "tether", Password: bmcPassword}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Admin.CreateNode(ctx, &v1.CreateNodeRequest{Name: "bm-1", Template: "bm", Macs: []string{mac},
		Bmc: &v1.NodeBMC{Address: b.Address("1"), Credential: "rack", CaPem: string(b.CAPEM()), BootMode: "legacy"}}); err != nil {
		t.Fatal(err)
	}
	return &redfishVM{vmEnv: &vmEnv{cp: cp, node: "bm-1", template: "bm", a: a, stateDir: stateDir}, bmc: b, vm: vm}
}

func (e *redfishVM) provision(t testing.TB, ctx context.Context) string {
	t.Helper()
	resp, err := e.cp.Admin.ProvisionInstance(ctx, &v1.ProvisionInstanceRequest{Node: e.node, Provider: redfish.Name})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Instance.Id
}

// consoleOf reads the VM's serial log (the instance's own console route
// is the qemu provider's; this VM is the BMC's).
func (e *redfishVM) consoleOf() string {
	b, _ := os.ReadFile(e.vm.P.ConsoleLogPath(e.vm.ID))
	return string(b)
}

func (e *redfishVM) waitRunning(t testing.TB, ctx context.Context, id string) {
	t.Helper()
	deadline := time.Now().Add(bootTimeout)
	var last *v1.Instance
	for time.Now().Before(deadline) && ctx.Err() == nil {
		in, err := e.cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: id})
		if err == nil {
			last = in
			if in.Status == v1.InstanceStatus_INSTANCE_STATUS_RUNNING && in.AgentPhase == v1.AgentPhase_AGENT_PHASE_READY {
				return
			}
			if in.Status == v1.InstanceStatus_INSTANCE_STATUS_ERROR {
				break
			}
		}
		// Polling a real VM's boot: nothing to wait on but the server's answers.
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("instance %s did not become running within %s; last %v\nconsole:\n%s", id, bootTimeout, last, tail(e.consoleOf(), 4000))
}

// TestVMRedfish: provision through the BMC (one-time PXE override, power
// on) -> the firmware netboots by MAC -> running; stop and start with a
// fresh token for the new boot; reboot; terminate powers the machine off
// and clears the override.
func TestVMRedfish(t *testing.T) {
	const mac = "52:54:00:0e:2f:01"
	env := newRedfishVM(t, mac)
	ctx := vmCtx(t)
	start := time.Now()
	id := env.provision(t, ctx)
	env.waitRunning(t, ctx, id)
	t.Logf("provision -> running through the test BMC in %s", time.Since(start).Round(10*time.Millisecond))
	checkNetbootConsole(t, env.consoleOf(), mac)
	in, err := env.cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: id})
	if err != nil || in.CloudInstanceId != redfish.MachineID(env.node) {
		t.Fatalf("machine id %q, %v", in.GetCloudInstanceId(), err)
	}

	if _, err := env.cp.Admin.StopInstance(ctx, &v1.InstanceActionRequest{Id: id}); err != nil {
		in, _ := env.cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: id})
		t.Fatalf("%v; instance: %v\nconsole:\n%s", err, in, tail(env.consoleOf(), 3000))
	}
	if st, err := env.vm.PowerState(ctx); err != nil || st != redfish.PowerOff {
		t.Fatalf("after stop the VM is %s (%v)", st, err)
	}
	certs := len(env.certs(t, ctx, id))
	if _, err := env.cp.Admin.StartInstance(ctx, &v1.InstanceActionRequest{Id: id}); err != nil {
		t.Fatal(err)
	}
	env.waitRunning(t, ctx, id)
	if n := len(env.certs(t, ctx, id)); n <= certs {
		t.Fatalf("a start must enroll again with a fresh token: %d certificates, had %d", n, certs)
	}

	before := bootID(t, env.vmEnv, ctx, id)
	if _, err := env.cp.Admin.RebootInstance(ctx, &v1.InstanceActionRequest{Id: id}); err != nil {
		t.Fatal(err)
	}
	env.waitRunning(t, ctx, id)
	if after := bootID(t, env.vmEnv, ctx, id); after == before {
		t.Fatalf("the machine did not reboot: boot id %s unchanged", after)
	}
	if got := env.bmc.Boots("1"); !slices.Equal(got, []string{"Pxe", "Pxe", "Pxe"}) {
		t.Errorf("boots %q, want three from the one-time Pxe override", got)
	}

	if _, err := env.cp.Admin.TerminateInstance(ctx, &v1.InstanceActionRequest{Id: id}); err != nil {
		t.Fatal(err)
	}
	if st, err := env.vm.PowerState(ctx); err != nil || st != redfish.PowerOff {
		t.Fatalf("after terminate the VM is %s (%v)", st, err)
	}
	if b := env.bmc.Boot("1"); b.BootSourceOverrideEnabled != redfish.OverrideDisabled {
		t.Errorf("override after terminate: %+v", b)
	}
}

// BenchmarkRedfishBootToRunning is BenchmarkBootToRunning/bios with the
// machine powered through the test BMC instead of launched by tetherd's
// qemu provider: the difference is what the Redfish calls (service root,
// Systems, the system, the boot override PATCH, the reset, PowerState
// polls) add to a firmware netboot. Each iteration provisions, waits for
// running and terminates (power off; the next power-on boots the VM
// again). Run it beside the qemu one:
//
//	TETHER_E2E=1 go test -tags nobadger,nobbolt,nomysql -run '^$' -bench 'RedfishBootToRunning' -benchtime 3x ./e2e/
//	TETHER_E2E=1 go test -tags nobadger,nobbolt,nomysql -run '^$' -bench 'BootToRunning/bios' -benchtime 3x ./e2e/
func BenchmarkRedfishBootToRunning(b *testing.B) {
	env := newRedfishVM(b, "52:54:00:be:0f:01")
	ctx := context.Background()
	var running, machine []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		id := env.provision(b, ctx)
		recorded := false
		deadline := start.Add(bootTimeout)
		for {
			in, err := env.cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: id})
			if err == nil && !recorded && in.CloudInstanceId != "" {
				// The provider returned: override set, powered on, PowerState On.
				machine, recorded = append(machine, time.Since(start)), true
			}
			if err == nil && in.Status == v1.InstanceStatus_INSTANCE_STATUS_RUNNING && in.AgentPhase == v1.AgentPhase_AGENT_PHASE_READY {
				running = append(running, time.Since(start))
				break
			}
			if err == nil && in.Status == v1.InstanceStatus_INSTANCE_STATUS_ERROR {
				b.Fatalf("boot %d: %s", i, in.ErrorMessage)
			}
			if time.Now().After(deadline) {
				b.Fatalf("boot %d: not running after %s\n%s", i, bootTimeout, tail(env.consoleOf(), 3000))
			}
			time.Sleep(20 * time.Millisecond)
		}
		b.StopTimer()
		if _, err := env.cp.Admin.TerminateInstance(ctx, &v1.InstanceActionRequest{Id: id}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(median(machine).Seconds(), "s-machine-recorded")
	b.ReportMetric(median(running).Seconds(), "s-running")
}
