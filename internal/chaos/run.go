package chaos

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/internal/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
	"github.com/tetherfleet/tether/providers/fake"
)

// Config is one chaos run.
type Config struct {
	Tetherd  string        // path to the tetherd binary
	WorkDir  string        // data dir, logs and the fake's machine file go here
	Duration time.Duration // how long load and faults run
	Store    string        // "" (SQLite) or a postgres:// URL
	// Instances is how many non-pooled fake instances the provisioner keeps;
	// with the pool members they are the simulated agents.
	Instances int
	Pools     int // pools of PoolSize fake members each
	PoolSize  int
	Claimers  int // concurrent claim/release loops
	// KillMin and KillMax bound the random wait between two kill -9s.
	KillMin, KillMax time.Duration
	// RestartStore, when set, restarts the database once, half-way through
	// the run (PostgreSQL).
	RestartStore func() error
	Out          io.Writer
}

// Counters are what the load did, printed with the invariants.
type Counters struct {
	Kills, Restarts, StoreRestarts, Drops, Provisions, CallErrors atomic.Int64
	AgentsEnrolled, AgentsConnected, TasksFinished                atomic.Int64
}

// Run starts tetherd, drives load and faults for cfg.Duration, lets it
// recover, and checks the invariants. It returns the results; err is set
// when the run itself could not be carried out.
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	d := &daemon{bin: cfg.Tetherd, dataDir: filepath.Join(cfg.WorkDir, "data"), listen: addr, store: cfg.Store,
		logPath: filepath.Join(cfg.WorkDir, "tetherd.log")}
	// Provisioning wants boot artifacts; fake machines never read them.
	for _, a := range []string{"kernel", "initramfs"} {
		p := filepath.Join(cfg.WorkDir, a)
		if err := os.WriteFile(p, []byte("chaos "+a), 0o600); err != nil {
			return nil, fmt.Errorf("boot artifact: %w", err)
		}
		d.extra = append(d.extra, "--"+a, p)
	}
	if err := d.init(ctx); err != nil {
		return nil, err
	}
	if err := d.start(); err != nil {
		return nil, err
	}
	defer d.stop()
	dl, err := newDialer(d.dataDir)
	if err != nil {
		return nil, err
	}
	conn, err := dl.dial(&dl.admin)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	admin := v1.NewAdminServiceClient(conn)
	if err := waitReady(ctx, admin); err != nil {
		return nil, err
	}
	node, pools, err := seed(ctx, admin, cfg)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(cfg.Out, "chaos: tetherd on %s, %d pools x %d, %d instances, %d claimers, for %s\n",
		addr, cfg.Pools, cfg.PoolSize, cfg.Instances, cfg.Claimers, cfg.Duration)

	l := &Ledger{}
	var c Counters
	h := &harness{cfg: cfg, admin: admin, dl: dl, ledger: l, c: &c, node: node, pools: pools,
		machinesFile: filepath.Join(d.dataDir, "fake-machines.json"), agents: map[string]bool{}, errCodes: map[codes.Code]int{}}
	loadCtx, stopLoad := context.WithTimeout(ctx, cfg.Duration)
	var wg sync.WaitGroup
	spawn := func(f func(context.Context)) { wg.Add(1); go func() { defer wg.Done(); f(loadCtx) }() }
	spawn(h.machines)
	spawn(h.provisioner)
	spawn(h.terminator)
	spawn(h.tasks)
	spawn(h.watcher)
	spawn(h.dropper)
	for i := 0; i < cfg.Claimers; i++ {
		spawn(h.claimer)
	}
	if cfg.RestartStore != nil {
		spawn(func(ctx context.Context) {
			if sleep(ctx, cfg.Duration/2) {
				if err := cfg.RestartStore(); err != nil {
					fmt.Fprintf(cfg.Out, "chaos: restarting the database failed: %v\n", err)
					return
				}
				c.StoreRestarts.Add(1)
			}
		})
	}
	// The killer: kill -9 at a random moment every KillMin..KillMax, and
	// restart on the same data dir.
	for loadCtx.Err() == nil {
		wait := cfg.KillMin + time.Duration(mrand.Int64N(int64(cfg.KillMax-cfg.KillMin)+1))
		select {
		case <-loadCtx.Done():
		case <-time.After(wait):
			d.kill()
			c.Kills.Add(1)
			if err := d.start(); err != nil {
				stopLoad()
				wg.Wait()
				return nil, err
			}
			c.Restarts.Add(1)
		}
	}
	stopLoad()
	wg.Wait()
	h.stopAgents()

	// Recovery: one last kill -9 with no load, restart, and wait for the
	// reconciliation loops to converge before reading the state.
	d.kill()
	c.Kills.Add(1)
	if err := d.start(); err != nil {
		return nil, err
	}
	if err := waitReady(ctx, admin); err != nil {
		return nil, err
	}
	var res []Result
	var o Observed
	deadline := time.Now().Add(90 * time.Second)
	for {
		o, err = observe(ctx, admin, h.machinesFile)
		if err != nil {
			return nil, err
		}
		res = Check(l, o)
		if allOK(res) || time.Now().After(deadline) {
			break
		}
		time.Sleep(2 * time.Second) // the provider-sync loop runs every 2 s
	}
	fmt.Fprintf(cfg.Out, "load: %d kill -9 (%d restarts, %d database restarts), %d agents enrolled, %d agent connections, %d provisions, %d tasks created, %d finished by agents, %d claims, %d releases, %d terminates, %d dropped calls, %d watcher streams, %d replayed tokens, %d call errors (expected while tetherd is down)\n",
		c.Kills.Load(), c.Restarts.Load(), c.StoreRestarts.Load(), len(l.Enrollments), c.AgentsConnected.Load(), c.Provisions.Load(), len(l.Tasks), c.TasksFinished.Load(),
		len(l.Claims), len(l.Releases), len(l.Terminates), c.Drops.Load(), len(l.Live), l.Replays, c.CallErrors.Load())
	fmt.Fprintf(cfg.Out, "call errors by code: %v\n", h.errCodes)
	if h.unknown != nil {
		fmt.Fprintf(cfg.Out, "first error without a gRPC status (counted as Unknown): %v\n", h.unknown)
	}
	states := map[string]int{}
	for _, in := range o.Instances {
		states[in.Status]++
	}
	fmt.Fprintf(cfg.Out, "after recovery: %d instances by state %v, %d fake machines, %d events, %d tasks\n",
		len(o.Instances), states, len(o.Machines), len(o.Events), len(o.Tasks))
	for _, r := range res {
		fmt.Fprintln(cfg.Out, r)
		for i, v := range r.Violations {
			if i == 20 {
				fmt.Fprintf(cfg.Out, "    ... and %d more\n", len(r.Violations)-20)
				break
			}
			fmt.Fprintln(cfg.Out, "    "+v)
		}
	}
	return res, nil
}

func allOK(rs []Result) bool {
	for _, r := range rs {
		if !r.OK() {
			return false
		}
	}
	return true
}

// seed makes the module, template, node and pools the load uses.
func seed(ctx context.Context, admin v1.AdminServiceClient, cfg Config) (string, []string, error) {
	const tag = "chaos"
	if _, err := testcp.PushModule(ctx, admin, tag, "1", testcp.TinyErofs()); err != nil {
		return "", nil, fmt.Errorf("seed module: %w", err)
	}
	if _, err := admin.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: tag, RootModules: []*v1.ModuleRef{{Name: tag, Version: "1"}}}); err != nil {
		return "", nil, fmt.Errorf("seed template: %w", err)
	}
	if _, err := admin.CreateNode(ctx, &v1.CreateNodeRequest{Name: tag, Template: tag}); err != nil {
		return "", nil, fmt.Errorf("seed node: %w", err)
	}
	var pools []string
	for i := 0; i < cfg.Pools; i++ {
		name := fmt.Sprintf("chaos-%d", i)
		if _, err := admin.CreatePool(ctx, &v1.CreatePoolRequest{Name: name, Template: tag, Provider: fake.Name,
			TargetSize: int32(cfg.PoolSize), MinSize: int32(cfg.PoolSize)}); err != nil {
			return "", nil, fmt.Errorf("seed pool %s: %w", name, err)
		}
		pools = append(pools, name)
	}
	return tag, pools, nil
}

type harness struct {
	cfg          Config
	admin        v1.AdminServiceClient
	dl           *dialer
	ledger       *Ledger
	c            *Counters
	node         string
	pools        []string
	machinesFile string

	mu       sync.Mutex
	agents   map[string]bool // machine id + token already booted
	errCodes map[codes.Code]int
	// unknown is the first error that carried no gRPC status (Unknown):
	// tetherd never answers with Unknown, so it names what did.
	unknown error
	running []string // instances whose agent reported ready
	cancels []context.CancelFunc
	agentWG sync.WaitGroup
}

func (h *harness) callErr(err error) {
	if err != nil {
		h.c.CallErrors.Add(1)
		h.mu.Lock()
		c := status.Code(err)
		h.errCodes[c]++
		if c == codes.Unknown && h.unknown == nil {
			h.unknown = err
		}
		h.mu.Unlock()
	}
}

func call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, 10*time.Second)
}

// machines plays the fake provider's machines: each new boot (a machine
// with a token not seen before) becomes a simulated agent.
func (h *harness) machines(ctx context.Context) {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ms, err := fake.ReadFile(h.machinesFile)
		if err != nil {
			continue // not written yet
		}
		for _, m := range ms {
			key := m.ID + "/" + m.Enrollment.Token
			h.mu.Lock()
			seen := h.agents[key]
			h.agents[key] = true
			h.mu.Unlock()
			if seen || m.Enrollment.Token == "" {
				continue
			}
			actx, cancel := context.WithCancel(context.Background())
			h.mu.Lock()
			h.cancels = append(h.cancels, cancel)
			h.mu.Unlock()
			h.agentWG.Add(1)
			go func() { defer h.agentWG.Done(); h.agent(actx, m.Enrollment.Token) }()
		}
	}
}

func (h *harness) stopAgents() {
	h.mu.Lock()
	for _, c := range h.cancels {
		c()
	}
	h.mu.Unlock()
	h.agentWG.Wait()
}

// agent enrolls with the machine's token, replays it once, then holds a
// Connect stream (reconnecting across kills), heartbeating and finishing
// every task it is given.
func (h *harness) agent(ctx context.Context, token string) {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		h.callErr(err)
		return
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		h.callErr(err)
		return
	}
	csr := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
	conn, err := h.dl.dial(nil)
	if err != nil {
		h.callErr(err)
		return
	}
	defer conn.Close()
	enroll := v1.NewEnrollmentServiceClient(conn)
	sum := sha256.Sum256([]byte(token))
	var resp *v1.EnrollResponse
	for resp == nil {
		cctx, cancel := call(ctx)
		resp, err = enroll.Enroll(cctx, &v1.EnrollRequest{Token: token, CsrPem: csr})
		cancel()
		if err != nil {
			h.callErr(err)
			if c := status.Code(err); c != codes.Unavailable && c != codes.DeadlineExceeded || ctx.Err() != nil {
				return // spent or refused (an answer lost in a kill); the instance's boot timeout owns it
			}
			if !sleep(ctx, 500*time.Millisecond) {
				return
			}
		}
	}
	h.ledger.Enroll(Enrollment{InstanceID: resp.InstanceId, TokenHash: hex.EncodeToString(sum[:])})
	h.c.AgentsEnrolled.Add(1)
	if mrand.IntN(4) == 0 {
		cctx, cancel := call(ctx)
		_, rerr := enroll.Enroll(cctx, &v1.EnrollRequest{Token: token, CsrPem: csr})
		cancel()
		if c := status.Code(rerr); c != codes.Unavailable && c != codes.DeadlineExceeded {
			h.ledger.Replay(rerr == nil)
		}
	}
	block, _ := pem.Decode([]byte(resp.CertificatePem))
	if block == nil {
		h.callErr(errors.New("enroll answer has no certificate"))
		return
	}
	cert := tls.Certificate{Certificate: [][]byte{block.Bytes}, PrivateKey: key}
	aconn, err := h.dl.dial(&cert)
	if err != nil {
		h.callErr(err)
		return
	}
	defer aconn.Close()
	client := v1.NewAgentServiceClient(aconn)
	first := true
	for ctx.Err() == nil {
		if err := h.stream(ctx, client, resp.InstanceId, &first); err != nil {
			if c := status.Code(err); c == codes.PermissionDenied || c == codes.Unauthenticated || c == codes.NotFound {
				return // terminated: the certificate no longer opens a stream
			}
			h.callErr(err)
		}
		if !sleep(ctx, time.Duration(500+mrand.IntN(1500))*time.Millisecond) {
			return
		}
	}
}

func (h *harness) stream(ctx context.Context, client v1.AgentServiceClient, instanceID string, first *bool) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := client.Connect(sctx)
	if err != nil {
		return err
	}
	var sendMu sync.Mutex
	send := func(m *v1.AgentMessage) error { sendMu.Lock(); defer sendMu.Unlock(); return s.Send(m) }
	hb := func() error {
		return send(&v1.AgentMessage{Msg: &v1.AgentMessage_Heartbeat{Heartbeat: &v1.Heartbeat{
			Phase: v1.AgentPhase_AGENT_PHASE_READY, AgentVersion: "chaos", BootId: "chaos"}}})
	}
	if err := hb(); err != nil {
		return err
	}
	h.c.AgentsConnected.Add(1)
	if *first {
		*first = false
		h.mu.Lock()
		h.running = append(h.running, instanceID)
		h.mu.Unlock()
	}
	errc := make(chan error, 1)
	go func() {
		for {
			m, err := s.Recv()
			if err != nil {
				errc <- err
				return
			}
			if t := m.GetTask(); t != nil {
				if err := send(&v1.AgentMessage{Msg: &v1.AgentMessage_TaskUpdate{TaskUpdate: &v1.TaskUpdate{
					TaskId: t.TaskId, Status: v1.TaskStatus_TASK_STATUS_SUCCEEDED, Result: &v1.TaskResult{}}}}); err == nil {
					h.c.TasksFinished.Add(1)
				}
			}
		}
	}()
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return err
		case <-tick.C:
			if err := hb(); err != nil {
				return err
			}
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (h *harness) randomRunning() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.running) == 0 {
		return ""
	}
	return h.running[mrand.IntN(len(h.running))]
}

// provisioner keeps creating non-pooled fake instances up to cfg.Instances.
func (h *harness) provisioner(ctx context.Context) {
	for n := 0; n < h.cfg.Instances && ctx.Err() == nil; {
		cctx, cancel := call(ctx)
		_, err := h.admin.ProvisionInstance(cctx, &v1.ProvisionInstanceRequest{Node: h.node, Provider: fake.Name})
		cancel()
		if err != nil {
			h.callErr(err)
			sleep(ctx, 300*time.Millisecond)
			continue
		}
		n++
		h.c.Provisions.Add(1)
		sleep(ctx, 20*time.Millisecond)
	}
}

// terminator terminates a random running instance every second or so
// (pool members included: the pool replaces them).
func (h *harness) terminator(ctx context.Context) {
	for sleep(ctx, time.Duration(500+mrand.IntN(1000))*time.Millisecond) {
		id := h.randomRunning()
		if id == "" {
			continue
		}
		cctx, cancel := call(ctx)
		_, err := h.admin.TerminateInstance(cctx, &v1.InstanceActionRequest{Id: id})
		cancel()
		if err != nil {
			h.callErr(err)
			continue
		}
		h.ledger.Terminate(id)
	}
}

// tasks creates exec tasks on running instances.
func (h *harness) tasks(ctx context.Context) {
	for sleep(ctx, time.Duration(20+mrand.IntN(60))*time.Millisecond) {
		id := h.randomRunning()
		if id == "" {
			continue
		}
		cctx, cancel := call(ctx)
		t, err := h.admin.CreateTask(cctx, &v1.CreateTaskRequest{InstanceId: id, Kind: v1.TaskKind_TASK_KIND_EXEC,
			Exec: &v1.ExecPayload{Argv: []string{"true"}}})
		cancel()
		if err != nil {
			h.callErr(err)
			continue
		}
		h.ledger.Task(t.Id)
	}
}

// claimer acquires a member, holds it a moment and releases it, retrying
// the release across kills until the server answers it.
func (h *harness) claimer(ctx context.Context) {
	for sleep(ctx, time.Duration(mrand.IntN(200))*time.Millisecond) {
		pool := h.pools[mrand.IntN(len(h.pools))]
		cctx, cancel := call(ctx)
		r, err := h.admin.AcquirePoolMember(cctx, &v1.AcquirePoolMemberRequest{PoolName: pool, AcquiredBy: "chaos"})
		cancel()
		if err != nil {
			h.callErr(err)
			continue
		}
		h.ledger.Claim(Claim{ClaimID: r.ClaimId, InstanceID: r.Instance.GetId(), PoolID: r.PoolId})
		sleep(ctx, time.Duration(mrand.IntN(2000))*time.Millisecond)
		for attempt := 0; attempt < 50; attempt++ {
			// The release must go out even as the run ends: a claim left
			// open is not a broken invariant, but it is not the load asked.
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := h.admin.ReleasePoolMember(cctx, &v1.ReleasePoolMemberRequest{InstanceId: r.Instance.GetId()})
			cancel()
			if err == nil {
				h.ledger.Release(Release{InstanceID: r.Instance.GetId(), ClaimID: r.ClaimId})
				break
			}
			h.callErr(err)
			if c := status.Code(err); c != codes.Unavailable && c != codes.DeadlineExceeded {
				break // released by an earlier attempt whose answer was lost, or reaped
			}
			time.Sleep(300 * time.Millisecond) // tetherd is restarting
		}
	}
}

// dropper makes calls and abandons them mid-flight: a cancelled context
// resets the HTTP/2 stream while the server is still working on it.
func (h *harness) dropper(ctx context.Context) {
	for sleep(ctx, time.Duration(50+mrand.IntN(200))*time.Millisecond) {
		conn, err := h.dl.dial(&h.dl.admin)
		if err != nil {
			h.callErr(err)
			continue
		}
		admin := v1.NewAdminServiceClient(conn)
		cctx, cancel := context.WithTimeout(ctx, time.Duration(1+mrand.IntN(8))*time.Millisecond)
		switch mrand.IntN(3) {
		case 0:
			var r *v1.AcquirePoolMemberResponse
			r, err = admin.AcquirePoolMember(cctx, &v1.AcquirePoolMemberRequest{PoolName: h.pools[0], AcquiredBy: "chaos-dropper"})
			if err == nil {
				// It finished before the drop: an acknowledged claim like
				// any other, so record it and give the member back.
				h.ledger.Claim(Claim{ClaimID: r.ClaimId, InstanceID: r.Instance.GetId(), PoolID: r.PoolId})
				rctx, rcancel := call(ctx)
				if _, rerr := admin.ReleasePoolMember(rctx, &v1.ReleasePoolMemberRequest{InstanceId: r.Instance.GetId()}); rerr == nil {
					h.ledger.Release(Release{InstanceID: r.Instance.GetId(), ClaimID: r.ClaimId})
				} else {
					h.callErr(rerr)
				}
				rcancel()
			}
		case 1:
			if id := h.randomRunning(); id != "" {
				_, err = admin.CreateTask(cctx, &v1.CreateTaskRequest{InstanceId: id, Kind: v1.TaskKind_TASK_KIND_EXEC, Exec: &v1.ExecPayload{Argv: []string{"true"}}})
			}
		default:
			_, err = admin.ProvisionInstance(cctx, &v1.ProvisionInstanceRequest{Node: h.node, Provider: fake.Name})
		}
		cancel()
		if err != nil {
			h.c.Drops.Add(1)
		}
		if conn != nil {
			_ = conn.Close()
		}
	}
}

// watcher follows the event stream, opening a new one after every kill.
func (h *harness) watcher(ctx context.Context) {
	conn, err := h.dl.dial(&h.dl.admin)
	if err != nil {
		h.callErr(err)
		return
	}
	defer conn.Close()
	admin := v1.NewAdminServiceClient(conn)
	for ctx.Err() == nil {
		s, err := admin.WatchEvents(ctx, &v1.WatchEventsRequest{}, grpc.WaitForReady(true))
		if err != nil {
			h.callErr(err)
			sleep(ctx, 300*time.Millisecond)
			continue
		}
		rec := h.ledger.Stream()
		for {
			e, err := s.Recv()
			if err != nil {
				break
			}
			rec(e.Id)
		}
	}
}

// observe reads the state the invariants are checked against.
func observe(ctx context.Context, admin v1.AdminServiceClient, machinesFile string) (Observed, error) {
	o := Observed{Now: time.Now(), FakeProvider: fake.Name}
	var evs []Event
	for tok := ""; ; {
		r, err := admin.ListEvents(ctx, &v1.ListEventsRequest{PageSize: 1000, PageToken: tok})
		if err != nil {
			return o, fmt.Errorf("list events: %w", err)
		}
		for _, e := range r.Events {
			evs = append(evs, Event{ID: e.Id, Kind: e.Kind, InstanceID: e.InstanceId, CorrelationID: e.CorrelationId})
		}
		if tok = r.NextPageToken; tok == "" {
			break
		}
	}
	for i := len(evs) - 1; i >= 0; i-- { // the API lists newest first
		o.Events = append(o.Events, evs[i])
	}
	for tok := ""; ; {
		r, err := admin.ListInstances(ctx, &v1.ListInstancesRequest{PageSize: 1000, PageToken: tok})
		if err != nil {
			return o, fmt.Errorf("list instances: %w", err)
		}
		for _, in := range r.Instances {
			o.Instances = append(o.Instances, Instance{ID: in.Id, Provider: in.Provider,
				Status:             strings.ToLower(strings.TrimPrefix(in.Status.String(), "INSTANCE_STATUS_")),
				Terminated:         in.Status == v1.InstanceStatus_INSTANCE_STATUS_TERMINATED,
				TerminateRequested: in.TerminateRequestedAt != nil})
		}
		if tok = r.NextPageToken; tok == "" {
			break
		}
	}
	for tok := ""; ; {
		r, err := admin.ListTasks(ctx, &v1.ListTasksRequest{PageSize: 1000, PageToken: tok})
		if err != nil {
			return o, fmt.Errorf("list tasks: %w", err)
		}
		for _, t := range r.Tasks {
			st := strings.ToLower(strings.TrimPrefix(t.Status.String(), "TASK_STATUS_"))
			o.Tasks = append(o.Tasks, Task{ID: t.Id, Status: st, LeaseExpires: t.LeaseExpiresAt.AsTime()})
		}
		if tok = r.NextPageToken; tok == "" {
			break
		}
	}
	ms, err := fake.ReadFile(machinesFile)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return o, err
	}
	for _, m := range ms {
		o.Machines = append(o.Machines, m.InstanceID)
	}
	return o, nil
}
