package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/qemu"
)

// Real-VM tests boot the netboot initramfs in QEMU through the qemu
// provider. They run under `make e2e` (which builds the artifacts first
// and sets TETHER_E2E=1); `go test ./...` skips them, saying so.

const bootTimeout = 150 * time.Second

type artifacts struct {
	kernel, initramfs, rootModule string
}

// requireVM skips loudly unless everything a real boot needs is here.
func requireVM(t testing.TB) artifacts {
	t.Helper()
	skip := func(format string, args ...any) {
		msg := "SKIP (real-VM e2e): " + fmt.Sprintf(format, args...)
		fmt.Fprintln(os.Stderr, msg)
		t.Skip(msg)
	}
	if os.Getenv("TETHER_E2E") == "" {
		skip("runs under `make e2e` (TETHER_E2E=1), which builds the initramfs and the example module first")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		skip("qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	a := artifacts{
		kernel:     filepath.Join(root, ".cache", "kernel", "vmlinuz"),
		initramfs:  filepath.Join(root, "build", "initramfs.cpio"),
		rootModule: filepath.Join(root, "build", "modules", "tether-example-root.erofs"),
	}
	for _, p := range []string{a.kernel, a.initramfs, a.rootModule} {
		if _, err := os.Stat(p); err != nil {
			skip("%s is missing; run `make initramfs modules` (make e2e does)", p)
		}
	}
	return a
}

// vmEnv is a control plane with the real qemu provider and a template of
// the example root module.
type vmEnv struct {
	stateDir string
	cp       *testcp.ControlPlane
	node     string
	template string
	a        artifacts
	// bootWithin overrides bootTimeout (a stock OS boots slower under TCG).
	bootWithin time.Duration
	// debian is the Debian root module's image, when the env boots it.
	debian []byte
}

func newVMEnv(t testing.TB, extra ...testcp.Option) *vmEnv {
	a := requireVM(t)
	data, err := os.ReadFile(a.rootModule)
	if err != nil {
		t.Fatal(err)
	}
	return newRootEnv(t, a, "example", data, extra...)
}

// newRootEnv is newVMEnv with the root module given: the template's one
// root layer is data, pushed as name:1.
func newRootEnv(t testing.TB, a artifacts, module string, data []byte, extra ...testcp.Option) *vmEnv {
	stateDir := qemuStateDir(t)
	opts := append([]testcp.Option{testcp.With(func(o *daemon.ServeOptions) {
		o.Providers.QEMU.Mode, o.Providers.QEMU.StateDir, o.Kernel, o.Initramfs = "real", stateDir, a.kernel, a.initramfs
	})}, extra...)
	return setUpVMEnv(t, testcp.Start(t, opts...), a, stateDir, module, data)
}

// newProcessVMEnv is newVMEnv with tetherd run as its own process
// (bin/tetherd), so that the test can kill it with -9.
func newProcessVMEnv(t testing.TB) *vmEnv {
	a := requireVM(t)
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	tetherd := filepath.Join(root, "bin", "tetherd")
	if _, err := os.Stat(tetherd); err != nil {
		msg := fmt.Sprintf("SKIP (real-VM e2e): %s is missing; run `make build` (make e2e does)", tetherd)
		fmt.Fprintln(os.Stderr, msg)
		t.Skip(msg)
	}
	data, err := os.ReadFile(a.rootModule)
	if err != nil {
		t.Fatal(err)
	}
	stateDir := qemuStateDir(t)
	cp := testcp.StartProcess(t, tetherd, "--qemu-mode", "real", "--qemu-state-dir", stateDir, "--kernel", a.kernel,
		"--initramfs", a.initramfs, "--unauthenticated-rate", "-1", "--log-level", "debug")
	return setUpVMEnv(t, cp, a, stateDir, "example", data)
}

// qemuStateDir is a fresh qemu state dir, removed after the test. QMP
// sockets live under it: its path is kept short.
func qemuStateDir(t testing.TB) string {
	stateDir, err := os.MkdirTemp("", "tq")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(stateDir) })
	return stateDir
}

// setUpVMEnv gives cp the root module as module:1, a template of it and
// a node of the template, both named after the test.
func setUpVMEnv(t testing.TB, cp *testcp.ControlPlane, a artifacts, stateDir, module string, data []byte) *vmEnv {
	ctx := context.Background()
	cp.PushModule(ctx, module, "1", data)
	name := strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	if len(name) > 40 {
		name = name[:40]
	}
	if _, err := cp.Admin.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: name, RootModules: []*v1.ModuleRef{{Name: module, Version: "1"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Admin.CreateNode(ctx, &v1.CreateNodeRequest{Name: name, Template: name}); err != nil {
		t.Fatal(err)
	}
	env := &vmEnv{cp: cp, node: name, template: name, a: a, stateDir: stateDir}
	t.Cleanup(func() { env.terminateAll(t) })
	return env
}

// terminateAll makes sure no VM outlives its test.
func (e *vmEnv) terminateAll(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	list, err := e.cp.Admin.ListInstances(ctx, &v1.ListInstancesRequest{PageSize: 1000})
	if err != nil {
		t.Errorf("cleanup: list instances to terminate their VMs: %v", err)
		return
	}
	for _, in := range list.Instances {
		if in.Status != v1.InstanceStatus_INSTANCE_STATUS_TERMINATED && in.Provider == "qemu" {
			if _, err := e.cp.Admin.TerminateInstance(ctx, &v1.InstanceActionRequest{Id: in.Id}); err != nil {
				t.Errorf("cleanup: terminate %s: %v", in.Id, err)
			}
			if pid := qemuPID(in.Id); pid != "" {
				t.Errorf("cleanup: the VM of %s outlived its terminate (pid %s)", in.Id, pid)
			}
		}
	}
}

func (e *vmEnv) provision(t *testing.T, ctx context.Context) string {
	t.Helper()
	resp, err := e.cp.Admin.ProvisionInstance(ctx, &v1.ProvisionInstanceRequest{Node: e.node, Provider: "qemu"})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Instance.Id
}

func (e *vmEnv) console(ctx context.Context, id string) string {
	s, err := e.cp.Admin.GetInstanceConsole(ctx, &v1.GetInstanceConsoleRequest{Id: id})
	if err != nil {
		return ""
	}
	var b strings.Builder
	for {
		c, err := s.Recv()
		if err != nil {
			return b.String()
		}
		b.Write(c.Data)
	}
}

// waitRunning waits for the instance to be running with a ready agent and
// dumps the console on failure.
func (e *vmEnv) waitRunning(t *testing.T, ctx context.Context, id string, after func(*v1.Instance) bool) *v1.Instance {
	t.Helper()
	within := bootTimeout
	if e.bootWithin > 0 {
		within = e.bootWithin
	}
	deadline := time.Now().Add(within)
	var last *v1.Instance
	for time.Now().Before(deadline) {
		in, err := e.cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: id})
		if err == nil {
			last = in
			if in.Status == v1.InstanceStatus_INSTANCE_STATUS_RUNNING && in.AgentPhase == v1.AgentPhase_AGENT_PHASE_READY && (after == nil || after(in)) {
				return in
			}
			if in.Status == v1.InstanceStatus_INSTANCE_STATUS_ERROR {
				break
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("instance %s did not become running within %s; last %v\nconsole:\n%s", id, within, last, tail(e.console(ctx, id), 4000))
	return nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func (e *vmEnv) exec(t *testing.T, ctx context.Context, id string, argv ...string) string {
	t.Helper()
	task, err := e.cp.Admin.CreateTask(ctx, &v1.CreateTaskRequest{InstanceId: id, Kind: v1.TaskKind_TASK_KIND_EXEC, Exec: &v1.ExecPayload{Argv: argv}})
	if err != nil {
		t.Fatal(err)
	}
	got := waitTask(t, ctx, e.cp, task.Id)
	if got.Status != v1.TaskStatus_TASK_STATUS_SUCCEEDED {
		t.Fatalf("exec %v: %v %s %q", argv, got.Status, got.ErrorMessage, got.GetResult().GetOutput())
	}
	return string(got.Result.Output)
}

func vmCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestVMBoot: enroll, pull, verify, switch root, running; the serial log
// shows each agent phase.
func TestVMBoot(t *testing.T) {
	env := newVMEnv(t)
	ctx := vmCtx(t)
	start := time.Now()
	id := env.provision(t, ctx)
	in := env.waitRunning(t, ctx, id, nil)
	t.Logf("provision -> running in %s", time.Since(start).Round(10*time.Millisecond))
	console := env.console(ctx, id)
	for _, want := range []string{"phase discovering", "phase enrolling", "phase pulling", "phase mounting", "phase switching", "phase ready", "TETHER_EXAMPLE_READY"} {
		if !strings.Contains(console, want) {
			t.Errorf("console lacks %q", want)
		}
	}
	if len(in.RunningModuleDigests) != 1 {
		t.Errorf("running modules %v", in.RunningModuleDigests)
	}
}

// TestVMExec: a task in the switched root returns /etc/os-release from the module.
func TestVMExec(t *testing.T) {
	env := newVMEnv(t)
	ctx := vmCtx(t)
	id := env.provision(t, ctx)
	env.waitRunning(t, ctx, id, nil)
	out := env.exec(t, ctx, id, "cat", "/etc/os-release")
	if !strings.Contains(out, "ID=tether-example") || !strings.Contains(out, `NAME="Tether Example"`) {
		t.Fatalf("os-release from the module:\n%s", out)
	}
	// The root really is the overlay of the module.
	mounts := env.exec(t, ctx, id, "cat", "/proc/mounts")
	if !strings.Contains(mounts, "overlay / overlay") {
		t.Fatalf("/ is not the overlay:\n%s", mounts)
	}
}

// TestVMRebootAndStopStart: each new boot enrolls again with a fresh
// one-time token (RAM-only nodes keep no identity, docs/design.md §3.5).
func TestVMRebootAndStopStart(t *testing.T) {
	env := newVMEnv(t)
	ctx := vmCtx(t)
	id := env.provision(t, ctx)
	env.waitRunning(t, ctx, id, nil)
	before := bootID(t, env, ctx, id)
	certsBefore := len(env.certs(t, ctx, id))

	if _, err := env.cp.Admin.RebootInstance(ctx, &v1.InstanceActionRequest{Id: id}); err != nil {
		t.Fatal(err)
	}
	env.waitRunning(t, ctx, id, nil)
	if after := bootID(t, env, ctx, id); after == before {
		t.Fatalf("the machine did not reboot: boot id %s unchanged", after)
	}
	if n := len(env.certs(t, ctx, id)); n <= certsBefore {
		t.Fatalf("a reboot must enroll again: %d certificates, had %d", n, certsBefore)
	}

	if _, err := env.cp.Admin.StopInstance(ctx, &v1.InstanceActionRequest{Id: id}); err != nil {
		t.Fatal(err)
	}
	in, err := env.cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: id})
	if err != nil || in.Status != v1.InstanceStatus_INSTANCE_STATUS_STOPPED {
		t.Fatalf("after stop: %v %v", in.GetStatus(), err)
	}
	if pid := qemuPID(id); pid != "" {
		t.Fatalf("qemu still running after stop: pid %s", pid)
	}
	// Stopping a stopped instance is a no-op success.
	if _, err := env.cp.Admin.StopInstance(ctx, &v1.InstanceActionRequest{Id: id}); err != nil {
		t.Fatalf("stop of a stopped instance: %v", err)
	}
	certsBefore = len(env.certs(t, ctx, id))
	if _, err := env.cp.Admin.StartInstance(ctx, &v1.InstanceActionRequest{Id: id}); err != nil {
		t.Fatal(err)
	}
	env.waitRunning(t, ctx, id, nil)
	if n := len(env.certs(t, ctx, id)); n <= certsBefore {
		t.Fatalf("a start must enroll again: %d certificates, had %d", n, certsBefore)
	}
}

func bootID(t *testing.T, env *vmEnv, ctx context.Context, id string) string {
	return strings.TrimSpace(env.exec(t, ctx, id, "cat", "/proc/sys/kernel/random/boot_id"))
}

func (e *vmEnv) certs(t *testing.T, ctx context.Context, id string) []*v1.Certificate {
	t.Helper()
	resp, err := e.cp.Admin.ListCertificates(ctx, &v1.ListCertificatesRequest{InstanceId: id})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Certificates
}

// qemuPID finds the VM process of an instance (empty if none).
func qemuPID(id string) string {
	out, _ := exec.Command("pgrep", "-f", "guest=tether-"+id).Output()
	return strings.TrimSpace(string(out))
}

// TestVMTerminate: the VM process is gone and the node certificate is
// revoked; a later agent call with that certificate is refused.
func TestVMTerminate(t *testing.T) {
	env := newVMEnv(t)
	ctx := vmCtx(t)
	id := env.provision(t, ctx)
	env.waitRunning(t, ctx, id, nil)
	// Take the node's identity out of the guest (exec runs as root there).
	certPEM := env.exec(t, ctx, id, "cat", "/run/tether/node.crt")
	keyPEM := env.exec(t, ctx, id, "cat", "/run/tether/node.key")
	cert, err := tls.X509KeyPair([]byte(certPEM), []byte(keyPEM))
	if err != nil {
		t.Fatalf("node identity from the guest: %v", err)
	}
	agentClient := v1.NewAgentServiceClient(env.cp.Dial(&cert))
	if _, err := agentClient.GetAssignment(ctx, &v1.GetAssignmentRequest{}); err != nil {
		t.Fatalf("the live node certificate must work before terminate: %v", err)
	}
	if qemuPID(id) == "" {
		t.Fatal("no qemu process for a running instance")
	}
	if _, err := env.cp.Admin.TerminateInstance(ctx, &v1.InstanceActionRequest{Id: id}); err != nil {
		t.Fatal(err)
	}
	if pid := qemuPID(id); pid != "" {
		t.Fatalf("qemu still running after terminate: pid %s", pid)
	}
	for _, c := range env.certs(t, ctx, id) {
		if c.RevokedAt == nil {
			t.Fatalf("certificate %s not revoked", c.Serial)
		}
	}
	_, err = v1.NewAgentServiceClient(env.cp.Dial(&cert)).GetAssignment(ctx, &v1.GetAssignmentRequest{})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a revoked node certificate must be refused: %v", err)
	}
}

// TestVMTamperedModule: the blob is corrupted on the control plane's disk;
// the agent refuses it and reports the mismatch, the instance shows the
// reason, and the node does not switch into the bad root.
func TestVMTamperedModule(t *testing.T) {
	env := newVMEnv(t)
	ctx := vmCtx(t)
	tpl, err := env.cp.Admin.GetTemplate(ctx, &v1.GetTemplateRequest{Name: env.template})
	if err != nil {
		t.Fatal(err)
	}
	corruptBlob(t, env.cp.DataDir, tpl.RootModules[0].Digest)
	id := env.provision(t, ctx)
	deadline := time.Now().Add(bootTimeout)
	for {
		in, err := env.cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: id})
		if err == nil && strings.Contains(in.AgentError, "mismatch") {
			if in.Status == v1.InstanceStatus_INSTANCE_STATUS_RUNNING {
				t.Fatal("a node with a tampered module is running")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the mismatch was never reported; last %v\nconsole:\n%s", in, tail(env.console(ctx, id), 4000))
		}
		time.Sleep(250 * time.Millisecond)
	}
	// The heartbeat carrying the error can reach tetherd before QEMU has
	// written the same line from the emulated serial port to the console
	// file: poll that file (another process's output) for a few seconds.
	console := env.console(ctx, id)
	for lineDeadline := time.Now().Add(10 * time.Second); !strings.Contains(console, "mismatch") && time.Now().Before(lineDeadline); {
		time.Sleep(100 * time.Millisecond)
		console = env.console(ctx, id)
	}
	if !strings.Contains(console, "mismatch") {
		t.Errorf("console does not say why:\n%s", tail(console, 3000))
	}
	if strings.Contains(console, "phase switching") || strings.Contains(console, "TETHER_EXAMPLE_READY") {
		t.Errorf("the node switched into the bad root:\n%s", tail(console, 3000))
	}
}

// TestVMControlPlaneRestartMidBoot: tetherd restarts while the node boots;
// the agent reconnects and finishes.
func TestVMControlPlaneRestartMidBoot(t *testing.T) {
	env := newVMEnv(t)
	ctx := vmCtx(t)
	id := env.provision(t, ctx)
	// Wait until the agent is talking to us, then pull the rug.
	deadline := time.Now().Add(bootTimeout)
	for !strings.Contains(env.console(ctx, id), "phase enrolling") {
		if time.Now().After(deadline) {
			t.Fatalf("the agent never started enrolling:\n%s", tail(env.console(ctx, id), 3000))
		}
		time.Sleep(100 * time.Millisecond)
	}
	env.cp.Stop()
	time.Sleep(3 * time.Second)
	env.cp.Restart()
	env.waitRunning(t, ctx, id, nil)
}

// TestVMWrongCAFingerprint: the node is handed a CA fingerprint that is
// not the control plane's; the agent refuses to enroll and says why on
// the console. The VM is booted through the qemu provider directly, since
// tetherd only ever hands out its own fingerprint.
func TestVMWrongCAFingerprint(t *testing.T) {
	env := newVMEnv(t)
	ctx := vmCtx(t)
	// A real instance and token, so the only thing wrong is the pin.
	inst, token := env.cp.Provision(ctx, env.node)
	stateDir, err := os.MkdirTemp("", "tq")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(stateDir)
	p, err := qemu.New(qemu.Config{Mode: qemu.ModeReal, StateDir: stateDir})
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(env.cp.Addr)
	wrong := "sha256:" + strings.Repeat("0", 64)
	if _, err := p.Provision(ctx, providers.Spec{InstanceID: inst.Id, Boot: providers.Boot{
		KernelPath: env.a.kernel, InitramfsPath: env.a.initramfs,
		Enrollment: providers.Enrollment{ControlPlaneURL: "https://10.0.2.2:" + port, Token: token, CAFingerprint: wrong},
	}}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := p.Terminate(context.Background(), inst.Id); err != nil {
			t.Errorf("terminate the VM: %v", err)
		}
		if pid := qemuPID(inst.Id); pid != "" {
			t.Errorf("the VM outlived its terminate: pid %s", pid)
		}
	}()
	deadline := time.Now().Add(bootTimeout)
	for {
		b, _ := os.ReadFile(p.ConsoleLogPath(inst.Id))
		console := string(b)
		if strings.Contains(console, "FAILED") && strings.Contains(console, strings.Repeat("0", 64)) {
			if !strings.Contains(strings.ToLower(console), "fingerprint") {
				t.Fatalf("the refusal does not mention the fingerprint:\n%s", tail(console, 3000))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no refusal on the console:\n%s", tail(console, 3000))
		}
		time.Sleep(250 * time.Millisecond)
	}
	// Nothing was enrolled, and the token is still unspent.
	if certs := env.certs(t, ctx, inst.Id); len(certs) != 0 {
		t.Fatalf("a node with a wrong pin got %d certificates", len(certs))
	}
}

// TestVMPool: a pool of 2 real VMs warms up and becomes ready; a member is
// acquired, released (recycled: its VM is destroyed) and replenished.
func TestVMPool(t *testing.T) {
	env := newVMEnv(t, testcp.With(func(o *daemon.ServeOptions) { o.Loops.PoolReaperEvery = 2 * time.Second }))
	ctx := vmCtx(t)
	waitReady := startPool(t, ctx, env.cp, "vm-pool", env.template, 2*bootTimeout, 500*time.Millisecond)
	p := waitReady(2)
	if p.Counts.Warming != 0 || p.Counts.Deficit != 0 {
		t.Fatalf("counts after warm-up: %+v", p.Counts)
	}
	claim, err := env.cp.Admin.AcquirePoolMember(ctx, &v1.AcquirePoolMemberRequest{PoolName: "vm-pool", AcquiredBy: "e2e", AcquiredFor: "TestVMPool"})
	if err != nil {
		t.Fatal(err)
	}
	member := claim.Instance.Id
	if out := env.exec(t, ctx, member, "cat", "/etc/os-release"); !strings.Contains(out, "tether-example") {
		t.Fatalf("the claimed member does not run the template's root:\n%s", out)
	}
	rel, err := env.cp.Admin.ReleasePoolMember(ctx, &v1.ReleasePoolMemberRequest{InstanceId: member})
	if err != nil || rel.Disposition != "recycled" {
		t.Fatalf("release: %v %v", rel, err)
	}
	if pid := qemuPID(member); pid != "" {
		t.Fatalf("a recycled member's VM is still running: pid %s", pid)
	}
	evs, err := env.cp.Admin.ListEvents(ctx, &v1.ListEventsRequest{Kind: "pool.released", CorrelationId: claim.ClaimId})
	if err != nil || len(evs.Events) != 1 || evs.Events[0].Payload.GetFields()["acquired_by"].GetStringValue() != "e2e" {
		t.Fatalf("pool.released with attribution: %v %v", evs, err)
	}
	p = waitReady(2)
	for _, m := range p.Members {
		if m.InstanceId == member {
			t.Fatalf("the recycled member is counted again: %+v", p.Members)
		}
	}
}

// TestVMExtensionModule: an extension module is attached read-only at
// /run/tether/ext/<name> on the running node, and detached by module_sync
// once the template no longer assigns it.
func TestVMExtensionModule(t *testing.T) {
	env := newVMEnv(t)
	ctx := vmCtx(t)
	hello, err := os.ReadFile(filepath.Join(filepath.Dir(env.a.rootModule), "tether-example-hello.erofs"))
	if err != nil {
		t.Fatal(err)
	}
	env.cp.PushModule(ctx, "hello", "1", hello)
	if _, err := env.cp.Admin.UpdateTemplate(ctx, &v1.UpdateTemplateRequest{Name: env.template, UpdateMask: []string{"extension_modules"},
		ExtensionModules: []*v1.ModuleRef{{Name: "hello", Version: "1"}}}); err != nil {
		t.Fatal(err)
	}
	id := env.provision(t, ctx)
	env.waitRunning(t, ctx, id, func(in *v1.Instance) bool { return len(in.RunningModuleDigests) == 2 })
	want, err := os.ReadFile(filepath.Join("..", "examples", "hello", "usr", "share", "tether-example", "hello"))
	if err != nil {
		t.Fatal(err)
	}
	if got := env.exec(t, ctx, id, "cat", "/run/tether/ext/hello/usr/share/tether-example/hello"); got != string(want) {
		t.Fatalf("extension file: %q, want %q", got, want)
	}
	if mounts := env.exec(t, ctx, id, "cat", "/proc/mounts"); !strings.Contains(mounts, "/run/tether/ext/hello erofs ro") {
		t.Fatalf("the extension is not a read-only erofs mount:\n%s", mounts)
	}

	if _, err := env.cp.Admin.UpdateTemplate(ctx, &v1.UpdateTemplateRequest{Name: env.template, UpdateMask: []string{"extension_modules"}}); err != nil {
		t.Fatal(err)
	}
	task, err := env.cp.Admin.CreateTask(ctx, &v1.CreateTaskRequest{InstanceId: id, Kind: v1.TaskKind_TASK_KIND_MODULE_SYNC})
	if err != nil {
		t.Fatal(err)
	}
	got := waitTask(t, ctx, env.cp, task.Id)
	if got.Status != v1.TaskStatus_TASK_STATUS_SUCCEEDED || !strings.Contains(string(got.GetResult().GetOutput()), "detached extension hello") {
		t.Fatalf("module_sync: %v %s %q", got.Status, got.ErrorMessage, got.GetResult().GetOutput())
	}
	if mounts := env.exec(t, ctx, id, "cat", "/proc/mounts"); strings.Contains(mounts, "/run/tether/ext/hello") {
		t.Fatalf("the extension is still mounted after module_sync:\n%s", mounts)
	}
}

// startPool creates a qemu pool of two on the template, drains it when the
// test ends, and returns a wait (up to within, polling every poll: a real
// VM's boot gives nothing else to wait on) for it to hold want ready
// members.
func startPool(t *testing.T, ctx context.Context, cp *testcp.ControlPlane, name, template string, within, poll time.Duration) func(want int32) *v1.Pool {
	t.Helper()
	if _, err := cp.Admin.CreatePool(ctx, &v1.CreatePoolRequest{Name: name, Template: template, Provider: "qemu", TargetSize: 2}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = cp.Admin.DrainPool(dctx, &v1.PoolActionRequest{Name: name})
	})
	return func(want int32) *v1.Pool {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			p, err := cp.Admin.GetPool(ctx, &v1.GetPoolRequest{Name: name})
			if err == nil && p.Counts.GetReady() == want {
				return p
			}
			if time.Now().After(deadline) {
				t.Fatalf("pool %s never had %d ready members: %v %v", name, want, p.GetCounts(), err)
			}
			time.Sleep(poll)
		}
	}
}
