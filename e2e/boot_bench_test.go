package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	"github.com/tetherfleet/tether/internal/uki"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
	"github.com/tetherfleet/tether/providers/qemu"
)

// bootMarks are console lines that end a boot phase, in order. The host
// stamps each as it appears in the serial log (the agent's own stamps have
// one-second resolution). The first three only appear in a firmware
// netboot (bios, uefi).
var bootMarks = []struct{ phase, line string }{
	{"qemu", "SeaBIOS (version "},                    // provision call, worker, QEMU until its firmware's first line
	{"firmware+DHCP", "Filename: "},                  // QEMU, firmware, iPXE start and its DHCP
	{"loader", " bytes [script]"},                    // the per-boot iPXE script fetched
	{"HTTP Boot DHCP", "  URI: http"},                // OVMF's own HTTP Boot: firmware and its DHCP, the image's URL known
	{"image transfer", "Downloading...100%"},         // OVMF downloaded the whole UKI
	{"kernel+initramfs transfer", "Probing EDD"},     // both fetched over HTTP; iPXE starts the kernel
	{"kernel start", "Linux version "},               // firmware loaded kernel and initramfs
	{"kernel", "tether-agent dev starting as pid 1"}, // QEMU (+ firmware) + kernel until /init runs
	{"network", "boot: network up"},                  // mounts, kernel modules, DHCP or static ip=
	{"agent start", "tether-agent: phase enrolling"},
	{"enrolled", "tether-agent: enrolled as instance"},
	{"modules verified", "tether-agent: phase mounting"},
	{"switched", "TETHER_EXAMPLE_READY"},   // overlay mounted, root switched, busybox init ran
	{"ready", "tether-agent: phase ready"}, // the successor agent reconnected and reported ready
}

// netbootOnly are the marks that end a phase only in a firmware netboot.
var netbootOnly = map[string]bool{"firmware+DHCP": true, "loader": true, "kernel+initramfs transfer": true, "HTTP Boot DHCP": true, "image transfer": true}

// BenchmarkBootToRunning boots the example root in QEMU through tetherd,
// one VM at a time, for each boot mode of the qemu provider (direct
// kernel boot; SeaBIOS and UEFI firmware netboot through the NIC's iPXE
// over QEMU's user-mode network), and reports the median time from the
// provision call to each phase and to the instance showing running. Run 5
// boots of each with:
//
//	TETHER_E2E=1 go test -tags nobadger,nobbolt,nomysql -run '^$' -bench BootToRunning -benchtime 5x ./e2e/
//
// The debian case boots the stock Debian root of the Debian e2e (systemd,
// nothing of Tether's in it) directly, to compare with the same root
// through initramfs/floor (scripts/bench-boot.sh debian).
func BenchmarkBootToRunning(b *testing.B) {
	for _, mode := range []string{"direct", "bios", "uefi", "debian"} {
		b.Run(mode, func(b *testing.B) { benchBoot(b, mode) })
	}
}

func benchBoot(b *testing.B, mode string) {
	a := requireVM(b)
	if mode == "uefi" {
		requireFiles(b, map[string]string{ovmfCode: "ovmf", ovmfVars: "ovmf"})
	}
	root := a.rootModule
	if mode == "debian" {
		root = debianModulePath(b)
	}
	bc := newBootCP(b, a, mode, root, false)
	samples := map[string][]time.Duration{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		running, marks := bc.boot(b, i)
		samples["running"] = append(samples["running"], running)
		for phase, at := range marks {
			samples[phase] = append(samples[phase], at)
		}
	}
	b.StopTimer()
	for _, m := range bootMarks {
		if len(samples[m.phase]) > 0 {
			b.ReportMetric(median(samples[m.phase]).Seconds(), "s-"+strings.NewReplacer(" ", "-", "+", "-").Replace(m.phase))
		}
	}
	b.ReportMetric(median(samples["running"]).Seconds(), "s-running")
	fmt.Fprintf(os.Stderr, "%s: boot to running over %d boots: %v\n", mode, len(samples["running"]), samples["running"])
	// UEFI's EFI-stub kernel prints no "Probing EDD": no transfer mark.
	if mode == "bios" {
		reportTransfer(b, a, bc.netboot, median(samples["kernel+initramfs transfer"])-median(samples["loader"]))
	}
}

// BenchmarkBootUKI is issue 29's comparison: power-on to running over
// OVMF's own UEFI HTTP Boot of a signed unified kernel image under Secure
// Boot (uki), against OVMF + iPXE fetching the kernel and initramfs
// (uefi), against a direct kernel boot (direct); three control planes,
// one boot of each in turn, so the three share every moment of the
// machine. A fourth boots the same image with its initramfs stored as
// given (uefi-http-raw), to show what the LZ4 initramfs saves. It reports
// each mode's median and its phase marks; from "image transfer" to
// "kernel start" is the Secure Boot check and the stub:
//
//	TETHER_E2E=1 go test -tags nobadger,nobbolt,nomysql -run '^$' -bench BootUKI -benchtime 5x ./e2e/
func BenchmarkBootUKI(b *testing.B) {
	a := requireVM(b)
	requireFiles(b, map[string]string{ovmfCode: "ovmf", ovmfVars: "ovmf"})
	u := prepareUKI(b, "127.0.0.1")
	_, nbPort, _ := net.SplitHostPort(u.netLis.Addr().String())
	signed := u.build(b, "boot.efi", a.initramfs, nbPort, true)
	raw := u.buildWith(b, "raw.efi", a.initramfs, nbPort, true, uki.CompressNone)
	cps := []*bootCP{
		newBootCP(b, a, "direct", a.rootModule, false),
		newBootCP(b, a, "uefi", a.rootModule, false),
		newBootCP(b, a, "uefi-http", a.rootModule, false, testcp.WithDataDir(u.data), testcp.With(func(o *daemon.ServeOptions) {
			// The image pins this API address, CA and hand-off port.
			o.Listeners.GRPC, o.Test.NetbootListener = u.apiAddr, u.netLis
			o.Providers.QEMU.SecureBoot, o.UKIs = true, []string{"boot=" + signed, "raw=" + raw}
		})),
	}
	// The raw image is another template and node on the same control
	// plane: an image pins its control plane's address and CA.
	cps = append(cps, cps[2].withNode(b, "uefi-http-raw", "raw", "52:54:00:be:0e:02"))
	samples := map[string]map[string][]time.Duration{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, bc := range cps {
			running, marks := bc.boot(b, i)
			if samples[bc.mode] == nil {
				samples[bc.mode] = map[string][]time.Duration{}
			}
			samples[bc.mode]["running"] = append(samples[bc.mode]["running"], running)
			for phase, at := range marks {
				samples[bc.mode][phase] = append(samples[bc.mode][phase], at)
			}
		}
	}
	b.StopTimer()
	for _, bc := range cps {
		s := samples[bc.mode]
		b.ReportMetric(median(s["running"]).Seconds(), "s-running-"+bc.mode)
		var phases []string
		for _, m := range bootMarks {
			if len(s[m.phase]) > 0 {
				phases = append(phases, fmt.Sprintf("%s %.2fs", m.phase, median(s[m.phase]).Seconds()))
			}
		}
		fmt.Fprintf(os.Stderr, "%s: boot to running over %d boots: %v; median marks: %s\n", bc.mode, len(s["running"]), s["running"], strings.Join(phases, ", "))
	}
}

// bootCP is a control plane with the real qemu provider, the example root
// on a template, and one node to boot again and again.
type bootCP struct {
	cp       *testcp.ControlPlane
	stateDir string
	netboot  string
	mode     string
	node     string // "boot" unless withNode gave another
}

// withNode is the same control plane booting another node, of a template
// named like it with the same root, reported as mode.
func (bc *bootCP) withNode(b *testing.B, mode, name, mac string) *bootCP {
	ctx := context.Background()
	if _, err := bc.cp.Admin.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: name, RootModules: []*v1.ModuleRef{{Name: "example", Version: "1"}}}); err != nil {
		b.Fatal(err)
	}
	if _, err := bc.cp.Admin.CreateNode(ctx, &v1.CreateNodeRequest{Name: name, Template: name, Macs: []string{mac}}); err != nil {
		b.Fatal(err)
	}
	other := *bc
	other.mode, other.node = mode, name
	return &other
}

// newBootCP starts it. With tpm, every VM gets the node's swtpm and the
// node's EK is bound with attestation required, so each boot enrolls by
// attestation with no token.
func newBootCP(b *testing.B, a artifacts, mode, rootModule string, tpm bool, extra ...testcp.Option) *bootCP {
	boot := mode
	if mode == "debian" {
		boot = "direct"
	}
	stateDir, err := os.MkdirTemp("", "tq")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(stateDir) })
	netLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	cp := testcp.Start(b, append([]testcp.Option{testcp.With(func(o *daemon.ServeOptions) {
		o.Providers.QEMU.Mode, o.Providers.QEMU.StateDir, o.Kernel, o.Initramfs = "real", stateDir, a.kernel, a.initramfs
		o.Providers.QEMU.Boot, o.Test.NetbootListener, o.Providers.QEMU.TPM = boot, netLis, tpm
	})}, extra...)...)
	ctx := context.Background()
	data, err := os.ReadFile(rootModule)
	if err != nil {
		b.Fatal(err)
	}
	cp.PushModule(ctx, "example", "1", data)
	if _, err := cp.Admin.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: "boot", RootModules: []*v1.ModuleRef{{Name: "example", Version: "1"}}}); err != nil {
		b.Fatal(err)
	}
	node := &v1.CreateNodeRequest{Name: "boot", Template: "boot", Macs: []string{"52:54:00:be:0e:01"}}
	if tpm {
		ek, err := qemu.PrepareTPM(qemu.TPMDir(stateDir, node.Name))
		if err != nil {
			b.Fatal(err)
		}
		node.EkHashes, node.RequireAttestation = []string{ek}, true
	}
	if _, err := cp.Admin.CreateNode(ctx, node); err != nil {
		b.Fatal(err)
	}
	return &bootCP{cp: cp, stateDir: stateDir, netboot: netLis.Addr().String(), mode: mode}
}

// boot provisions the node, waits for it to run, and terminates it
// outside the timer: the time from the provision call to running, and to
// each boot mark on the console.
func (bc *bootCP) boot(b *testing.B, i int) (time.Duration, map[string]time.Duration) {
	ctx := context.Background()
	start := time.Now()
	node := bc.node
	if node == "" {
		node = "boot"
	}
	resp, err := bc.cp.Admin.ProvisionInstance(ctx, &v1.ProvisionInstanceRequest{Node: node, Provider: "qemu"})
	if err != nil {
		b.Fatal(err)
	}
	id := resp.Instance.Id
	stop := watchConsole(filepath.Join(bc.stateDir, id, "console.log"), start)
	within := bootTimeout
	if bc.mode == "debian" {
		within = debianBoot
	}
	deadline := start.Add(within)
	var running time.Duration
	for {
		in, err := bc.cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: id})
		if err == nil && in.Status == v1.InstanceStatus_INSTANCE_STATUS_RUNNING && in.AgentPhase == v1.AgentPhase_AGENT_PHASE_READY {
			running = time.Since(start)
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("boot %d: not running after %s", i, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
	keepConsole(b, filepath.Join(bc.stateDir, id, "console.log"), bc.mode, i)
	marks := stop()
	for phase := range marks {
		if (bc.mode == "direct" || bc.mode == "debian") && netbootOnly[phase] {
			delete(marks, phase) // the kernel's "Probing EDD" shows in a direct boot too
		}
	}
	b.StopTimer()
	if _, err := bc.cp.Admin.TerminateInstance(ctx, &v1.InstanceActionRequest{Id: id}); err != nil {
		b.Fatal(err)
	}
	b.StartTimer()
	return running, marks
}

// keepConsole copies a boot's serial log to TETHER_BENCH_CONSOLE_DIR, when
// set, to read the agent's own millisecond stamps of each step afterwards
// (the state dir, and the log in it, go when the benchmark ends).
func keepConsole(b *testing.B, path, mode string, i int) {
	dir := os.Getenv("TETHER_BENCH_CONSOLE_DIR")
	if dir == "" {
		return
	}
	data, err := os.ReadFile(path)
	if err != nil {
		b.Fatalf("keep the console log: %v", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatalf("keep the console log: %v", err)
	}
	dst := filepath.Join(dir, fmt.Sprintf("%s-%s-%d.log", mode, time.Now().UTC().Format("150405"), i))
	if err := os.WriteFile(dst, data, 0o644); err != nil {
		b.Fatalf("keep the console log: %v", err)
	}
}

// watchConsole stamps each boot mark as it appears in the log, polling
// every 5 ms; the returned function stops it and gives the offsets. It
// reads only what was appended since the last poll (keeping a line's worth
// before it, for a mark cut in two): the host's CPU is the VM's, and
// re-reading the whole log 200 times a second took a share of it.
func watchConsole(path string, start time.Time) func() map[string]time.Duration {
	seen := map[string]time.Duration{}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		var f *os.File
		defer func() {
			if f != nil {
				f.Close()
			}
		}()
		var tail []byte
		buf := make([]byte, 64<<10)
		for {
			if f == nil {
				f, _ = os.Open(path) // QEMU creates it; until then, try again
			}
			for f != nil {
				n, _ := f.Read(buf)
				if n == 0 {
					break
				}
				tail = append(tail, buf[:n]...)
				for _, m := range bootMarks {
					if _, ok := seen[m.phase]; !ok && bytes.Contains(tail, []byte(m.line)) {
						seen[m.phase] = time.Since(start)
					}
				}
				if len(tail) > 256 {
					tail = append(tail[:0], tail[len(tail)-256:]...)
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return func() map[string]time.Duration {
		close(stop)
		<-done
		return seen
	}
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// reportTransfer compares iPXE's HTTP fetch of the kernel and the
// initramfs (the time between the script and the kernel's start, so it
// includes iPXE's small per-file work) with curl fetching the same files
// from the same server over loopback.
func reportTransfer(b *testing.B, a artifacts, netboot string, ipxe time.Duration) {
	var total int64
	var curl time.Duration
	for _, path := range []string{a.kernel, a.initramfs} {
		data, err := os.ReadFile(path)
		if err != nil {
			b.Fatal(err)
		}
		total += int64(len(data))
		if _, err := exec.LookPath("curl"); err != nil {
			continue
		}
		url := fmt.Sprintf("http://%s/artifacts/sha256:%x", netboot, sha256.Sum256(data))
		out, err := exec.Command("curl", "-sS", "-o", "/dev/null", "-w", "%{time_total}", url).Output()
		if err != nil {
			b.Fatalf("curl %s: %v", url, err)
		}
		sec, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
		if err != nil {
			b.Fatalf("curl time %q: %v", out, err)
		}
		curl += time.Duration(sec * float64(time.Second))
	}
	mib := float64(total) / (1 << 20)
	if ipxe > 0 {
		b.ReportMetric(mib/ipxe.Seconds(), "MiB/s-ipxe")
	}
	if curl > 0 {
		b.ReportMetric(mib/curl.Seconds(), "MiB/s-curl")
	}
	fmt.Fprintf(os.Stderr, "kernel+initramfs %.1f MiB: iPXE %s, curl %s\n", mib, ipxe.Round(time.Millisecond), curl.Round(time.Millisecond))
}
