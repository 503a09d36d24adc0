package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
	"github.com/tetherfleet/tether/providers/libvirt"
	"github.com/tetherfleet/tether/providers/libvirt/libvirttest"
	"github.com/tetherfleet/tether/providers/qemu"
)

// BenchmarkLibvirtVsQEMUDirect boots the example root through one tetherd
// on both the qemu provider's direct mode and the libvirt provider's
// (direct kernel boot through a private libvirtd, QEMU under TCG when
// there is no KVM), alternating the two in each iteration and swapping
// which goes first, so machine load drifts over both alike. It reports the
// median time from the provision call to the kernel starting /init and to
// the instance showing running with a ready agent. Run 5 of each with:
//
//	TETHER_E2E=1 go test -tags nobadger,nobbolt,nomysql -run '^$' -bench LibvirtVsQEMUDirect -benchtime 5x ./e2e/
func BenchmarkLibvirtVsQEMUDirect(b *testing.B) {
	a := requireVM(b)
	d := libvirttest.Start(b)
	qemuDir, err := os.MkdirTemp("", "tq")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(qemuDir)
	cp := testcp.Start(b, testcp.With(func(o *daemon.ServeOptions) {
		o.Providers.QEMU.Mode, o.Providers.QEMU.StateDir, o.Providers.QEMU.Boot, o.Kernel, o.Initramfs = "real", qemuDir, "direct", a.kernel, a.initramfs
		o.Providers.Libvirt = daemon.LibvirtOptions{URI: d.URI, StateDir: d.StateDir, FileOwner: d.Owner, Boot: "direct"}
	}))
	ctx := context.Background()
	data, err := os.ReadFile(a.rootModule)
	if err != nil {
		b.Fatal(err)
	}
	cp.PushModule(ctx, "example", "1", data)
	if _, err := cp.Admin.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: "boot", RootModules: []*v1.ModuleRef{{Name: "example", Version: "1"}}}); err != nil {
		b.Fatal(err)
	}
	if _, err := cp.Admin.CreateNode(ctx, &v1.CreateNodeRequest{Name: "boot", Template: "boot"}); err != nil {
		b.Fatal(err)
	}
	consoleDir := map[string]string{qemu.Name: qemuDir, libvirt.Name: d.StateDir}
	running := map[string][]time.Duration{}
	kernel := map[string][]time.Duration{}
	boot := func(provider string) {
		start := time.Now()
		resp, err := cp.Admin.ProvisionInstance(ctx, &v1.ProvisionInstanceRequest{Node: "boot", Provider: provider})
		if err != nil {
			b.Fatal(err)
		}
		id := resp.Instance.Id
		marks := watchConsole(filepath.Join(consoleDir[provider], id, "console.log"), start)
		deadline := start.Add(bootTimeout)
		for {
			in, err := cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: id})
			if err == nil && in.Status == v1.InstanceStatus_INSTANCE_STATUS_RUNNING && in.AgentPhase == v1.AgentPhase_AGENT_PHASE_READY {
				running[provider] = append(running[provider], time.Since(start))
				break
			}
			if err == nil && in.Status == v1.InstanceStatus_INSTANCE_STATUS_ERROR {
				b.Fatalf("%s boot: instance errored: %s", provider, in.ErrorMessage)
			}
			if time.Now().After(deadline) {
				b.Fatalf("%s boot: not running after %s", provider, bootTimeout)
			}
			// Polled: the sample's resolution is this interval.
			time.Sleep(20 * time.Millisecond)
		}
		if at, ok := marks()["kernel"]; ok {
			kernel[provider] = append(kernel[provider], at)
		}
		b.StopTimer()
		if _, err := cp.Admin.TerminateInstance(ctx, &v1.InstanceActionRequest{Id: id}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		order := []string{qemu.Name, libvirt.Name}
		if i%2 == 1 {
			order = []string{libvirt.Name, qemu.Name}
		}
		for _, p := range order {
			boot(p)
		}
	}
	b.StopTimer()
	for _, p := range []string{qemu.Name, libvirt.Name} {
		b.ReportMetric(median(kernel[p]).Seconds(), "s-"+p+"-kernel")
		b.ReportMetric(median(running[p]).Seconds(), "s-"+p+"-running")
		fmt.Fprintf(os.Stderr, "%s: boot to running over %d boots: %v\n", p, len(running[p]), running[p])
	}
}
