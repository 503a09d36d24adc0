package api_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/seediso"
	"github.com/tetherfleet/tether/internal/testkit/logbuf"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/external"
	"github.com/tetherfleet/tether/providers/fake"
	"github.com/tetherfleet/tether/providers/qemu"
)

// logBuffer collects a control plane's log output.
type logBuffer = logbuf.Buffer

// lifecycleCP starts tetherd with netboot artifacts, the given providers
// and its log captured.
func lifecycleCP(t *testing.T, logs *logBuffer, extra func(*daemon.ServeOptions), ps ...providers.Provider) *testcp.ControlPlane {
	t.Helper()
	dir := t.TempDir()
	kernel, initrd := filepath.Join(dir, "bzImage"), filepath.Join(dir, "initramfs.cpio")
	if err := os.WriteFile(kernel, []byte("not really a kernel"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(initrd, []byte("not really an initramfs"), 0o600); err != nil {
		t.Fatal(err)
	}
	return testcp.Start(t, testcp.WithLog(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))),
		testcp.With(func(o *daemon.ServeOptions) {
			o.Kernel, o.Initramfs, o.Test.Providers = kernel, initrd, ps
			o.Loops.WorkerPoll = 100 * time.Millisecond
			o.Providers.QEMU.Mode = "disabled"
			if extra != nil {
				extra(o)
			}
		}))
}

func noTokenLogged(t *testing.T, logs *logBuffer) {
	t.Helper()
	if strings.Contains(logs.String(), "tbt_") {
		t.Fatalf("a bootstrap token reached the log:\n%s", logs.String())
	}
}

func waitInstance(t *testing.T, cp *testcp.ControlPlane, id string, ok func(*v1.Instance) bool) *v1.Instance {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		in, err := cp.Admin.GetInstance(context.Background(), &v1.GetInstanceRequest{Id: id})
		if err == nil && ok(in) {
			return in
		}
		if time.Now().After(deadline) {
			t.Fatalf("instance %s: %v (%v)", id, in, err)
		}
		time.Sleep(20 * time.Millisecond) // polls a running tetherd over its API
	}
}

// provisionFake provisions on the fake provider and waits for the worker.
func provisionFake(t *testing.T, cp *testcp.ControlPlane, node string) (*v1.ProvisionInstanceResponse, *v1.Instance) {
	t.Helper()
	ctx := ctxT(t)
	resp, err := cp.Admin.ProvisionInstance(ctx, &v1.ProvisionInstanceRequest{Node: node, Provider: fake.Name, OperationId: "op-" + node})
	if err != nil {
		t.Fatal(err)
	}
	if resp.TaskId == "" || resp.BootstrapToken != "" || resp.Instance.Status != v1.InstanceStatus_INSTANCE_STATUS_PENDING {
		t.Fatalf("provision answered task %q token shown %v status %v", resp.TaskId, resp.BootstrapToken != "", resp.Instance.Status)
	}
	in := waitInstance(t, cp, resp.Instance.Id, func(in *v1.Instance) bool { return in.CloudInstanceId != "" })
	return resp, in
}

// boot plays the machine's agent: enroll with the token the provider was
// handed, connect and report ready.
func boot(t *testing.T, ctx context.Context, cp *testcp.ControlPlane, fp *fake.Provider, in *v1.Instance) (v1.AgentService_ConnectClient, tls.Certificate) {
	t.Helper()
	enr, ok := fp.Enrollment(in.CloudInstanceId)
	if !ok || !strings.HasPrefix(enr.Token, "tbt_") || enr.CAFingerprint != cp.Fingerprint() {
		t.Fatalf("the machine was not handed enrollment data: %+v", enr)
	}
	key := testcp.NewNodeKey(t)
	resp, err := v1.NewEnrollmentServiceClient(cp.Dial(nil)).Enroll(ctx, &v1.EnrollRequest{Token: enr.Token, CsrPem: key.CSRPEM})
	if err != nil {
		t.Fatalf("enroll with the provider's token: %v", err)
	}
	cert := key.Certificate(t, resp.CertificatePem)
	stream, err := v1.NewAgentServiceClient(cp.Dial(&cert)).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&v1.AgentMessage{Msg: &v1.AgentMessage_Heartbeat{Heartbeat: &v1.Heartbeat{Phase: v1.AgentPhase_AGENT_PHASE_READY, AgentVersion: "test"}}}); err != nil {
		t.Fatal(err)
	}
	waitInstance(t, cp, in.Id, func(in *v1.Instance) bool { return in.Status == v1.InstanceStatus_INSTANCE_STATUS_RUNNING })
	return stream, cert
}

func TestInstanceLifecycleOverTheAPI(t *testing.T) {
	logs := &logBuffer{}
	fp := fake.New()
	cp := lifecycleCP(t, logs, nil, fp)
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "edge")
	resp, in := provisionFake(t, cp, fleet.Node)
	// A retry with the operation id: same instance, same task, one machine.
	again, err := cp.Admin.ProvisionInstance(ctx, &v1.ProvisionInstanceRequest{Node: fleet.Node, Provider: fake.Name, OperationId: "op-" + fleet.Node})
	if err != nil || !again.Existing || again.Instance.Id != in.Id || again.TaskId != resp.TaskId {
		t.Fatalf("retry: %v %v", again, err)
	}
	if task, err := cp.Admin.GetTask(ctx, &v1.GetTaskRequest{Id: resp.TaskId}); err != nil ||
		task.Target != v1.TaskTarget_TASK_TARGET_WORKER || task.Kind != v1.TaskKind_TASK_KIND_PROVISION || task.Status != v1.TaskStatus_TASK_STATUS_SUCCEEDED {
		t.Fatalf("provision task %v %v", task, err)
	}
	if n := len(fp.Machines()); n != 1 {
		t.Fatalf("%d machines", n)
	}
	stream, _ := boot(t, ctx, cp, fp, in)

	// Stop, stop again (no-op), start (a new boot with a new token).
	got, err := cp.Admin.StopInstance(ctx, &v1.InstanceActionRequest{Id: in.Id})
	if err != nil || got.Status != v1.InstanceStatus_INSTANCE_STATUS_STOPPED {
		t.Fatalf("stop: %v %v", got, err)
	}
	if got, err := cp.Admin.StopInstance(ctx, &v1.InstanceActionRequest{Id: in.Id}); err != nil || got.Status != v1.InstanceStatus_INSTANCE_STATUS_STOPPED {
		t.Fatalf("stop again: %v %v", got, err)
	}
	_, err = cp.Admin.RebootInstance(ctx, &v1.InstanceActionRequest{Id: in.Id})
	wantCode(t, err, codes.FailedPrecondition)
	first, _ := fp.Enrollment(in.CloudInstanceId)
	got, err = cp.Admin.StartInstance(ctx, &v1.InstanceActionRequest{Id: in.Id})
	if err != nil || got.Status != v1.InstanceStatus_INSTANCE_STATUS_STARTING {
		t.Fatalf("start: %v %v", got, err)
	}
	if second, _ := fp.Enrollment(in.CloudInstanceId); second.Token == first.Token {
		t.Fatal("the new boot got the spent token")
	}

	// A provider failure is an error with the observed state recorded.
	fp.Inject(fake.OpTerminate, fake.Fault{Kind: providers.KindTransient, Times: 1, Message: "hypervisor busy"})
	_, err = cp.Admin.TerminateInstance(ctx, &v1.InstanceActionRequest{Id: in.Id})
	wantCode(t, err, codes.Unavailable)
	got, _ = cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: in.Id})
	if got.Status != v1.InstanceStatus_INSTANCE_STATUS_STARTING || !strings.Contains(got.ErrorMessage, "hypervisor busy") {
		t.Fatalf("after a failed terminate: %v %q", got.Status, got.ErrorMessage)
	}
	evs, err := cp.Admin.ListEvents(ctx, &v1.ListEventsRequest{InstanceId: in.Id, Kind: "instance.terminate_failed"})
	if err != nil || len(evs.Events) != 1 || evs.Events[0].Severity != v1.Severity_SEVERITY_HIGH {
		t.Fatalf("terminate_failed events: %v %v", evs, err)
	}

	// Terminate: the machine goes, the identity ends, the agent's stream is cut.
	got, err = cp.Admin.TerminateInstance(ctx, &v1.InstanceActionRequest{Id: in.Id})
	if err != nil || got.Status != v1.InstanceStatus_INSTANCE_STATUS_TERMINATED {
		t.Fatalf("terminate: %v %v", got, err)
	}
	if len(fp.Machines()) != 0 {
		t.Fatal("machine survived")
	}
	certs, _ := cp.Admin.ListCertificates(ctx, &v1.ListCertificatesRequest{InstanceId: in.Id})
	for _, c := range certs.Certificates {
		if c.RevokedAt == nil {
			t.Fatalf("certificate %s not revoked", c.Serial)
		}
	}
	for {
		_, err := stream.Recv()
		if err != nil {
			if status.Code(err) != codes.Unauthenticated {
				t.Fatalf("stream of a terminated instance ended with %v", err)
			}
			break
		}
	}
	if got, err := cp.Admin.TerminateInstance(ctx, &v1.InstanceActionRequest{Id: in.Id}); err != nil || got.Status != v1.InstanceStatus_INSTANCE_STATUS_TERMINATED {
		t.Fatalf("terminate again: %v %v", got, err)
	}
	for name, call := range map[string]func() error{
		"start": func() error { _, err := cp.Admin.StartInstance(ctx, &v1.InstanceActionRequest{Id: in.Id}); return err },
		"hold": func() error {
			_, err := cp.Admin.HoldInstance(ctx, &v1.HoldInstanceRequest{Id: in.Id, Reason: "x"})
			return err
		},
		"cordon": func() error {
			_, err := cp.Admin.CordonInstance(ctx, &v1.CordonInstanceRequest{Id: in.Id, Reason: "x"})
			return err
		},
		"seed": func() error { _, err := cp.Admin.CreateSeedISO(ctx, &v1.CreateSeedISORequest{Id: in.Id}); return err },
	} {
		if err := call(); status.Code(err) != codes.FailedPrecondition {
			t.Errorf("%s on a terminated instance: %v", name, err)
		}
	}
	noTokenLogged(t, logs)
}

func TestHoldCordonDrainOverTheAPI(t *testing.T) {
	logs := &logBuffer{}
	fp := fake.New()
	cp := lifecycleCP(t, logs, nil, fp)
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "edge")
	_, in := provisionFake(t, cp, fleet.Node)
	boot(t, ctx, cp, fp, in)

	_, err := cp.Admin.HoldInstance(ctx, &v1.HoldInstanceRequest{Id: in.Id})
	wantCode(t, err, codes.InvalidArgument)
	held, err := cp.Admin.HoldInstance(ctx, &v1.HoldInstanceRequest{Id: in.Id, Reason: "patching"})
	if err != nil || !held.Hold || held.HoldReason != "patching" {
		t.Fatalf("hold: %v %v", held, err)
	}
	_, err = cp.Admin.TerminateInstance(ctx, &v1.InstanceActionRequest{Id: in.Id})
	wantCode(t, err, codes.FailedPrecondition)

	_, err = cp.Admin.CordonInstance(ctx, &v1.CordonInstanceRequest{Id: in.Id})
	wantCode(t, err, codes.InvalidArgument)
	cr, err := cp.Admin.CordonInstance(ctx, &v1.CordonInstanceRequest{Id: in.Id, Reason: "kernel update"})
	if err != nil || cr.CordonState != "not_pooled" || cr.Instance.Cordon == nil || cr.Instance.Cordon.By == "" {
		t.Fatalf("cordon: %v %v", cr, err)
	}
	_, err = cp.Admin.CordonInstance(ctx, &v1.CordonInstanceRequest{Id: in.Id, Reason: "again"})
	wantCode(t, err, codes.FailedPrecondition)
	// Drain stops a held, cordoned instance.
	dr, err := cp.Admin.DrainInstance(ctx, &v1.DrainInstanceRequest{Id: in.Id, Reason: "retire"})
	if err != nil || dr.Instance.Status != v1.InstanceStatus_INSTANCE_STATUS_STOPPED || dr.CordonState != "already_cordoned" {
		t.Fatalf("drain: %v %v", dr, err)
	}
	ur, err := cp.Admin.UncordonInstance(ctx, &v1.InstanceActionRequest{Id: in.Id})
	if err != nil || ur.UncordonState != "cleared" || ur.Instance.Cordon != nil {
		t.Fatalf("uncordon: %v %v", ur, err)
	}
	if un, err := cp.Admin.UnholdInstance(ctx, &v1.InstanceActionRequest{Id: in.Id}); err != nil || un.Hold {
		t.Fatalf("unhold: %v %v", un, err)
	}
	_, err = cp.Admin.StopInstance(ctx, &v1.InstanceActionRequest{})
	wantCode(t, err, codes.InvalidArgument)
}

// The control plane dies between a terminate's intent and the provider's
// destroy; the next one finishes the job when it starts.
func TestInterruptedTerminateFinishesAfterRestart(t *testing.T) {
	logs := &logBuffer{}
	fp := fake.New()
	cp := lifecycleCP(t, logs, nil, fp)
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "edge")
	_, in := provisionFake(t, cp, fleet.Node)
	agentCtx, agentGone := context.WithCancel(ctx)
	boot(t, agentCtx, cp, fp, in)

	release := fp.Block(fake.OpTerminate)
	callCtx, hangUp := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := cp.Admin.TerminateInstance(callCtx, &v1.InstanceActionRequest{Id: in.Id})
		done <- err
	}()
	waitInstance(t, cp, in.Id, func(in *v1.Instance) bool { return in.TerminateRequestedAt != nil })
	hangUp() // the call dies with the destroy in flight
	<-done
	got := waitInstance(t, cp, in.Id, func(*v1.Instance) bool { return true })
	if got.Status == v1.InstanceStatus_INSTANCE_STATUS_TERMINATED || len(fp.Machines()) != 1 {
		t.Fatalf("before the restart: %v, %d machines", got.Status, len(fp.Machines()))
	}
	release()
	agentGone() // an open agent stream would hold the graceful stop for its whole grace
	cp.Restart()
	got = waitInstance(t, cp, in.Id, func(in *v1.Instance) bool { return in.Status == v1.InstanceStatus_INSTANCE_STATUS_TERMINATED })
	if len(fp.Machines()) != 0 {
		t.Fatal("the machine survived the resumed terminate")
	}
	certs, _ := cp.Admin.ListCertificates(ctx, &v1.ListCertificatesRequest{InstanceId: got.Id})
	if len(certs.Certificates) == 0 {
		t.Fatal("no certificates to check")
	}
	for _, c := range certs.Certificates {
		if c.RevokedAt == nil {
			t.Fatalf("certificate %s not revoked", c.Serial)
		}
	}
}

// spy hands a provider's enrollment tokens to the test, which otherwise
// never sees them.
type spy struct {
	*qemu.Provider
	mu     sync.Mutex
	tokens []string
}

func (s *spy) Provision(ctx context.Context, spec providers.Spec) (providers.Machine, error) {
	s.mu.Lock()
	s.tokens = append(s.tokens, spec.Boot.Enrollment.Token)
	s.mu.Unlock()
	return s.Provider.Provision(ctx, spec)
}

func TestQEMURecorderThroughTetherd(t *testing.T) {
	logs := &logBuffer{}
	stateDir, err := os.MkdirTemp("", "tq")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(stateDir) })
	q, err := qemu.New(qemu.Config{Mode: qemu.ModeRecorder, StateDir: stateDir})
	if err != nil {
		t.Fatal(err)
	}
	sp := &spy{Provider: q}
	cp := lifecycleCP(t, logs, nil, sp)
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "vm")
	resp, err := cp.Admin.ProvisionInstance(ctx, &v1.ProvisionInstanceRequest{Node: fleet.Node, Provider: "qemu"})
	if err != nil {
		t.Fatal(err)
	}
	in := waitInstance(t, cp, resp.Instance.Id, func(in *v1.Instance) bool { return in.CloudInstanceId != "" })
	entries := q.Recorded()
	if len(entries) != 1 || entries[0].Op != "provision" || entries[0].InstanceID != in.Id {
		t.Fatalf("recorded %+v", entries)
	}
	argv := strings.Join(entries[0].Argv, " ")
	sp.mu.Lock()
	token := sp.tokens[0]
	sp.mu.Unlock()
	if !strings.HasPrefix(token, "tbt_") {
		t.Fatalf("the provider was handed %q", token)
	}
	for _, want := range []string{"-kernel " + filepath.Join(cp.DataDir, "blobs", "sha256"), "-initrd ", "name=opt/tether/url,string=https://10.0.2.2:",
		"name=opt/tether/ca,string=" + cp.Fingerprint(), "name=opt/tether/token,file="} {
		if !strings.Contains(argv, want) {
			t.Errorf("argv lacks %q:\n%s", want, argv)
		}
	}
	if strings.Contains(argv, token) || strings.Contains(argv, "tbt_") {
		t.Fatalf("the token is on the qemu command line:\n%s", argv)
	}
	noTokenLogged(t, logs)

	// The console: nothing yet in recorder mode, then what the VM wrote.
	_, err = readConsole(ctx, cp, &v1.GetInstanceConsoleRequest{Id: in.Id})
	wantCode(t, err, codes.FailedPrecondition)
	path := q.ConsoleLogPath(in.Id)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("Linux version 6.1\ntether-agent: ready\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := readConsole(ctx, cp, &v1.GetInstanceConsoleRequest{Id: in.Id}); err != nil || !strings.HasPrefix(out, "Linux version") {
		t.Fatalf("console: %q %v", out, err)
	}
	if out, err := readConsole(ctx, cp, &v1.GetInstanceConsoleRequest{Id: in.Id, TailBytes: 6}); err != nil || out != "ready\n" {
		t.Fatalf("console tail: %q %v", out, err)
	}
	_, err = readConsole(ctx, cp, &v1.GetInstanceConsoleRequest{Id: in.Id, TailBytes: -1})
	wantCode(t, err, codes.InvalidArgument)

	// Follow: new output arrives on the open stream.
	fctx, stop := context.WithCancel(ctx)
	defer stop()
	stream, err := cp.Admin.GetInstanceConsole(fctx, &v1.GetInstanceConsoleRequest{Id: in.Id, Follow: true, TailBytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	if c, err := stream.Recv(); err != nil || string(c.Data) != "\n" {
		t.Fatalf("follow: %q %v", c.GetData(), err)
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString("login: ")
	f.Close()
	if c, err := stream.Recv(); err != nil || string(c.Data) != "login: " {
		t.Fatalf("follow: %q %v", c.GetData(), err)
	}
}

func readConsole(ctx context.Context, cp *testcp.ControlPlane, req *v1.GetInstanceConsoleRequest) (string, error) {
	stream, err := cp.Admin.GetInstanceConsole(ctx, req)
	if err != nil {
		return "", err
	}
	var out bytes.Buffer
	for {
		c, err := stream.Recv()
		if err == io.EOF {
			return out.String(), nil
		}
		if err != nil {
			return out.String(), err
		}
		out.Write(c.Data)
	}
}

func TestSeedISOCarriesAFreshToken(t *testing.T) {
	logs := &logBuffer{}
	cp := lifecycleCP(t, logs, nil)
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "edge")
	in, _ := cp.Provision(ctx, fleet.Node)
	resp, err := cp.Admin.CreateSeedISO(ctx, &v1.CreateSeedISORequest{Id: in.Id})
	if err != nil {
		t.Fatal(err)
	}
	m, err := seediso.ReadFrom(bytes.NewReader(resp.Iso))
	if err != nil {
		t.Fatal(err)
	}
	if m.CA != cp.Fingerprint() || !strings.HasPrefix(m.URL, "https://") {
		t.Fatalf("material %+v", m)
	}
	key := testcp.NewNodeKey(t)
	if _, err := v1.NewEnrollmentServiceClient(cp.Dial(nil)).Enroll(ctx, &v1.EnrollRequest{Token: m.Token, CsrPem: key.CSRPEM}); err != nil {
		t.Fatalf("enroll with the seed's token: %v", err)
	}
	_, err = cp.Admin.CreateSeedISO(ctx, &v1.CreateSeedISORequest{})
	wantCode(t, err, codes.InvalidArgument)
	noTokenLogged(t, logs)
}

func TestNetbootThroughTetherd(t *testing.T) {
	logs := &logBuffer{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cp := lifecycleCP(t, logs, func(o *daemon.ServeOptions) { o.Test.NetbootListener = lis }, pxe{external.New()})
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "metal")
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + lis.Addr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// An external machine is booted by its operator, never over the
	// network: its script is not handed to whoever asks.
	ext, _ := cp.Provision(ctx, fleet.Node)
	if code, body := get("/ipxe/" + ext.Id); code != http.StatusForbidden || strings.Contains(body, "tbt_") || !strings.Contains(body, "external") {
		t.Fatalf("an external instance's script: %d %q", code, body)
	}
	in := provisionPXE(t, cp, fleet.Node)
	code, script := get("/ipxe/" + in.Id)
	if code != http.StatusOK || !strings.Contains(script, "tether.token=tbt_") || !strings.Contains(script, "tether.ca="+cp.Fingerprint()) {
		t.Fatalf("script: %d\n%s", code, script)
	}
	if code, _ := get("/ipxe/" + in.Id); code != http.StatusGone {
		t.Fatalf("second fetch: %d", code)
	}
	// The kernel the script names is served.
	fields := strings.Fields(strings.Split(script, "\n")[1])
	kernelURL := fields[1]
	if i := strings.Index(kernelURL, "/artifacts/"); i < 0 {
		t.Fatalf("kernel url %q", kernelURL)
	} else if code, body := get(kernelURL[i:]); code != http.StatusOK || body != "not really a kernel" {
		t.Fatalf("kernel: %d %q", code, body)
	}
	noTokenLogged(t, logs)
}

// pxe is the external provider as if its machines netbooted: no provider
// netboots by instance id yet, and the script route serves only
// instances whose provider does.
type pxe struct{ providers.Provider }

func (pxe) Name() string   { return "pxe" }
func (pxe) Netboots() bool { return true }

// provisionPXE provisions an instance of the pxe provider and waits for
// its boot window.
func provisionPXE(t *testing.T, cp *testcp.ControlPlane, node string) *v1.Instance {
	t.Helper()
	resp, err := cp.Admin.ProvisionInstance(ctxT(t), &v1.ProvisionInstanceRequest{Node: node, Provider: "pxe"})
	if err != nil {
		t.Fatal(err)
	}
	return waitInstance(t, cp, resp.Instance.Id, func(in *v1.Instance) bool {
		return in.Status == v1.InstanceStatus_INSTANCE_STATUS_PROVISIONING
	})
}

// The liveness and provider-sync loops run inside tetherd.
func TestLivenessAndProviderSyncLoops(t *testing.T) {
	logs := &logBuffer{}
	fp := fake.New()
	clk := clock.NewFake(time.Now())
	cp := lifecycleCP(t, logs, func(o *daemon.ServeOptions) {
		o.Clock = clk
		o.Loops.ProviderSyncEvery = 100 * time.Millisecond
	}, fp)
	ctx := ctxT(t)
	gone := cp.SeedFleet(ctx, "gone")
	quiet := cp.SeedFleet(ctx, "quiet")
	_, a := provisionFake(t, cp, gone.Node)
	boot(t, ctx, cp, fp, a)
	_, b := provisionFake(t, cp, quiet.Node)
	boot(t, ctx, cp, fp, b)

	// A running row whose machine vanished: provider sync errors it.
	fp.Vanish(a.CloudInstanceId)
	got := waitInstance(t, cp, a.Id, func(in *v1.Instance) bool { return in.Status == v1.InstanceStatus_INSTANCE_STATUS_ERROR })
	if !strings.Contains(got.ErrorMessage, "machine gone") {
		t.Fatalf("error message %q", got.ErrorMessage)
	}
	// A quiet agent whose machine runs is silent, not dead; once the
	// machine stops, it errors with what the provider observed (provider
	// sync sees the stop before the liveness sensor's presumption).
	clk.Advance(11 * time.Minute)
	waitInstance(t, cp, b.Id, func(in *v1.Instance) bool { return in.SilentSince != nil })
	if got, _ := cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: b.Id}); got.Status != v1.InstanceStatus_INSTANCE_STATUS_RUNNING {
		t.Fatalf("a silent instance whose machine runs went %v", got.Status)
	}
	fp.SetState(b.CloudInstanceId, providers.StateStopped)
	got = waitInstance(t, cp, b.Id, func(in *v1.Instance) bool { return in.Status == v1.InstanceStatus_INSTANCE_STATUS_ERROR })
	if !strings.Contains(got.ErrorMessage, "machine exited outside Tether (provider fake reports it stopped)") &&
		!strings.Contains(got.ErrorMessage, "presumed dead") {
		t.Fatalf("error message %q", got.ErrorMessage)
	}
	evs, err := cp.Admin.ListEvents(ctx, &v1.ListEventsRequest{InstanceId: b.Id, Kind: "instance.silent"})
	if err != nil || len(evs.Events) != 1 {
		t.Fatalf("silent events: %v %v", evs, err)
	}
}
