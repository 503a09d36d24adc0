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
	"maps"
	mrand "math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/internal/tools/tinymodule"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/fake"
)

// Config is one chaos run.
type Config struct {
	Tetherd  string        // path to the tetherd binary
	WorkDir  string        // data dir, logs and the fake's machine file go here
	Duration time.Duration // how long load and faults run
	// Store is "" (SQLite, one tetherd) or a postgres:// URL (two tetherd
	// replicas on it, killed one at a time).
	Store string
	// Instances is how many non-pooled fake instances the provisioner keeps;
	// with the pool members they are the simulated agents.
	Instances int
	Pools     int // pools of PoolSize fake members each
	PoolSize  int
	Claimers  int // concurrent claim/release loops
	// KillMin and KillMax bound the random wait between two kill -9s.
	KillMin, KillMax time.Duration
	// DownMax bounds how long a killed replica stays down before its
	// restart (replicas only: a lone tetherd restarts at once), so that the
	// load has to fail over to the other.
	DownMax time.Duration
	// RestartStore, when set, restarts the database once, half-way through
	// the run (PostgreSQL).
	RestartStore func() error
	// OldTetherd, with Store, makes the run a rolling upgrade's middle:
	// replica 0 runs this older build and answers before replica 1 (Tetherd)
	// starts and migrates the database past it. Nothing is killed and the
	// database is not restarted (an old build refuses to start on a newer
	// schema, by design), and any call error but a refusal the load
	// expects breaks an invariant (MixedBuilds).
	OldTetherd string
	// Backup takes a `tetherd backup` half-way through the load (SQLite),
	// and after the run restores it into a new data dir served on another
	// port (checkBackup).
	Backup bool
	Out    io.Writer
}

// Counters are what the load did, printed with the invariants.
type Counters struct {
	Kills, Restarts, StoreRestarts, Drops, Provisions, CallErrors atomic.Int64
	AgentsEnrolled, AgentsConnected, TasksFinished                atomic.Int64
	// Crashes are machines the crasher stopped behind tetherd's back.
	Crashes atomic.Int64
	// Failovers are calls that failed Unavailable on one replica and
	// returned OK on another; AgentMoves are agents that moved to the next
	// replica after theirs failed them.
	Failovers, AgentMoves atomic.Int64
}

// Run starts tetherd (two replicas when cfg.Store is set, else one), drives
// load and faults for cfg.Duration, lets it recover, and checks the
// invariants. It returns the results; err is set when the run itself could
// not be carried out.
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	ds, err := newDaemons(cfg)
	if err != nil {
		return nil, err
	}
	if err := ds[0].init(ctx); err != nil {
		return nil, err
	}
	defer stopAll(ds)
	for _, d := range ds {
		if err := d.start(); err != nil {
			return nil, err
		}
		if cfg.OldTetherd != "" && d == ds[0] {
			// The old build makes the schema it knows before the new
			// one migrates past it, as in an upgrade.
			if err := waitOneReady(ctx, d); err != nil {
				return nil, fmt.Errorf("the old build (replica 0): %w", err)
			}
		}
	}
	dl, err := newDialer(ds[0].dataDir, listens(ds))
	if err != nil {
		return nil, err
	}
	conns, err := dl.dialAll(&dl.admin)
	if err != nil {
		return nil, err
	}
	defer closeAll(conns)
	var admins []v1.AdminServiceClient
	for _, c := range conns {
		admins = append(admins, v1.NewAdminServiceClient(c))
	}
	if err := waitAllReady(ctx, admins); err != nil {
		return nil, err
	}
	node, pools, err := seed(ctx, admins[0], cfg)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(cfg.Out, "chaos: tetherd on %s, %d pools x %d, %d instances, %d claimers, for %s\n",
		strings.Join(listens(ds), " and "), cfg.Pools, cfg.PoolSize, cfg.Instances, cfg.Claimers, cfg.Duration)

	l := &Ledger{}
	var c Counters
	h := &harness{cfg: cfg, admins: admins, dl: dl, ledger: l, c: &c, node: node, pools: pools, kills: make([]int, len(ds)),
		machinesFile: ds[0].fakeState, agents: map[string]bool{}, errCodes: map[codes.Code]int{}, firstErr: map[codes.Code]error{},
		killAgent: map[string]context.CancelFunc{}}
	if cfg.Backup {
		h.backup = &backupRun{}
	}
	loadCtx, stopLoad := context.WithTimeout(ctx, cfg.Duration)
	var wg sync.WaitGroup
	spawn := func(f func(context.Context)) { wg.Add(1); go func() { defer wg.Done(); f(loadCtx) }() }
	spawn(h.machines)
	spawn(h.provisioner)
	spawn(h.terminator)
	spawn(h.crasher)
	spawn(h.tasks)
	spawn(h.dropper)
	for i := range admins {
		spawn(func(ctx context.Context) { h.watcher(ctx, i) })
	}
	for i := 0; i < cfg.Claimers; i++ {
		spawn(h.claimer)
	}
	if cfg.RestartStore != nil && cfg.OldTetherd == "" {
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
	if h.backup != nil {
		spawn(func(lctx context.Context) {
			if sleep(lctx, cfg.Duration/2) {
				// The run's end must not cut the backup short.
				h.backup.take(ctx, cfg.Tetherd, ds[0].dataDir, filepath.Join(cfg.WorkDir, "tether.backup"))
			}
		})
	}
	spawn(func(ctx context.Context) { h.progress(ctx, time.Now()) })
	kerr := h.killer(loadCtx, ds)
	stopLoad()
	wg.Wait()
	h.stopAgents()
	if kerr != nil {
		return nil, kerr
	}
	fmt.Fprintf(cfg.Out, "chaos: load done (%s); the last kill -9, of every tetherd, then recovery\n", h.progressLine())
	if err := h.recover(ctx, ds); err != nil {
		return nil, err
	}
	fmt.Fprintln(cfg.Out, "chaos: checking the invariants until they hold or 90 s pass")
	res, o, err := h.converge(ctx)
	if err != nil {
		return nil, err
	}
	if cfg.OldTetherd != "" {
		res = append(res, MixedBuilds(h.errorCodes(), ds[0].logPath, ds[1].logPath))
	}
	if h.backup != nil {
		fmt.Fprintln(cfg.Out, "chaos: restoring the backup taken half-way into a new data dir")
		res = append(res, h.checkBackup(ctx, ds[0]))
	}
	h.report(o, res)
	return res, nil
}

// newDaemons describes the tetherd processes of a run: one on SQLite, or
// two replicas on the PostgreSQL store. Replicas share the data dir, as
// the replica tests do (store/postgres/servertest): one `tetherd init`
// gives them one CA, server certificate, credentials key and blob store.
// They share the fake's machine file too, so both providers see every
// machine and provider sync on either compares the store with all of them.
func newDaemons(cfg Config) ([]*daemon, error) {
	n := 1
	if cfg.Store != "" {
		n = 2
	} else if cfg.OldTetherd != "" {
		return nil, fmt.Errorf("chaos: an old build runs beside a new one only on a shared store (postgres)")
	}
	if cfg.Backup && cfg.Store != "" {
		return nil, fmt.Errorf("chaos: --backup is for SQLite; a PostgreSQL database is backed up with PostgreSQL's tools")
	}
	dataDir := filepath.Join(cfg.WorkDir, "data")
	var extra []string
	// Provisioning wants boot artifacts; fake machines never read them.
	for _, a := range []string{"kernel", "initramfs"} {
		p := filepath.Join(cfg.WorkDir, a)
		if err := os.WriteFile(p, []byte("chaos "+a), 0o600); err != nil {
			return nil, fmt.Errorf("boot artifact: %w", err)
		}
		extra = append(extra, "--"+a, p)
	}
	var ds []*daemon
	for i := 0; i < n; i++ {
		addr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		// The fake's machine file is the harness's, not tetherd's: it
		// lives beside the data dir, so a backup of the data dir taken
		// mid-run (--backup) does not race the harness writing it.
		d := &daemon{bin: cfg.Tetherd, dataDir: dataDir, listen: addr, store: cfg.Store, extra: extra,
			logPath: filepath.Join(cfg.WorkDir, "tetherd.log"), fakeState: filepath.Join(cfg.WorkDir, "fake-machines.json")}
		if n > 1 {
			d.logPath = filepath.Join(cfg.WorkDir, fmt.Sprintf("tetherd-%d.log", i))
			d.store = withAppName(cfg.Store, fmt.Sprintf("tetherd-%d", i))
		}
		if i == 0 && cfg.OldTetherd != "" {
			d.bin = cfg.OldTetherd
		}
		ds = append(ds, d)
	}
	return ds, nil
}

// withAppName adds application_name to a postgres:// URL, which tells the
// replicas' sessions apart in pg_stat_activity and pg_locks.
func withAppName(dsn, name string) string {
	sep := "&"
	if !strings.Contains(dsn, "?") {
		sep = "?"
	}
	return dsn + sep + "application_name=" + url.QueryEscape(name)
}

func listens(ds []*daemon) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.listen)
	}
	return out
}

func stopAll(ds []*daemon) {
	for _, d := range ds {
		d.stop()
	}
}

func waitAllReady(ctx context.Context, admins []v1.AdminServiceClient) error {
	for i, a := range admins {
		if err := waitReady(ctx, a); err != nil {
			return fmt.Errorf("replica %d: %w", i, err)
		}
	}
	return nil
}

// killer kill -9s a tetherd at a random moment every KillMin..KillMax
// until ctx ends, and restarts it on the same data dir. With replicas it
// kills one at random, keeps it down for up to DownMax while the other
// serves, and waits for it to answer again before the next kill, so one
// is always up (the database restart aside).
func (h *harness) killer(ctx context.Context, ds []*daemon) error {
	if h.cfg.OldTetherd != "" {
		<-ctx.Done() // mixed builds: nothing is killed
		return nil
	}
	for {
		wait := h.cfg.KillMin + time.Duration(mrand.Int64N(int64(h.cfg.KillMax-h.cfg.KillMin)+1))
		if !sleep(ctx, wait) {
			return nil
		}
		i := mrand.IntN(len(ds))
		ds[i].kill()
		h.c.Kills.Add(1)
		h.kills[i]++
		if len(ds) > 1 && h.cfg.DownMax > 0 {
			sleep(ctx, time.Duration(mrand.Int64N(int64(h.cfg.DownMax)+1)))
		}
		if err := ds[i].start(); err != nil {
			return err
		}
		h.c.Restarts.Add(1)
		if len(ds) > 1 {
			if err := waitReady(ctx, h.admins[i]); err != nil && ctx.Err() == nil {
				return fmt.Errorf("replica %d after its restart: %w", i, err)
			}
		}
	}
}

// progressEvery spaces the progress lines of a run: a 30-minute run
// should not be silent until its end.
const progressEvery = 30 * time.Second

// progress prints what the load has done so far every progressEvery until
// ctx ends.
func (h *harness) progress(ctx context.Context, start time.Time) {
	t := time.NewTicker(progressEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fmt.Fprintf(h.cfg.Out, "chaos: %s of %s: %s\n", time.Since(start).Round(time.Second), h.cfg.Duration, h.progressLine())
		}
	}
}

// progressLine is the load's running totals, in a line.
func (h *harness) progressLine() string {
	c, l := h.c, h.ledger
	l.mu.Lock()
	tasks, claims, enrolled := len(l.Tasks), len(l.Claims), len(l.Enrollments)
	l.mu.Unlock()
	return fmt.Sprintf("%d kill -9, %d database restarts, %d agents enrolled, %d provisions, %d tasks created, %d claims, %d call errors",
		c.Kills.Load(), c.StoreRestarts.Load(), enrolled, c.Provisions.Load(), tasks, claims, c.CallErrors.Load())
}

// recover is the last kill -9, of every tetherd, with no load; then the
// restart, waiting until each answers.
func (h *harness) recover(ctx context.Context, ds []*daemon) error {
	if h.cfg.OldTetherd != "" {
		return waitAllReady(ctx, h.admins) // the old build may not restart
	}
	for i, d := range ds {
		d.kill()
		h.c.Kills.Add(1)
		h.kills[i]++
	}
	for _, d := range ds {
		if err := d.start(); err != nil {
			return err
		}
	}
	return waitAllReady(ctx, h.admins)
}

// converge reads the state and checks it until every invariant holds or
// 90 s have passed, as the reconciliation loops catch up.
func (h *harness) converge(ctx context.Context) ([]Result, Observed, error) {
	deadline := time.Now().Add(90 * time.Second)
	for {
		o, err := observe(ctx, h.admins[0], h.machinesFile)
		if err != nil {
			return nil, o, err
		}
		res := Check(h.ledger, o)
		if allOK(res) || time.Now().After(deadline) {
			return res, o, nil
		}
		time.Sleep(2 * time.Second) // the provider-sync loop runs every 2 s
	}
}

// report prints what the load did, the state after recovery and the
// invariants.
func (h *harness) report(o Observed, res []Result) {
	c, l, out := h.c, h.ledger, h.cfg.Out
	kills := fmt.Sprintf("%d kill -9 (%d restarts, %d database restarts)", c.Kills.Load(), c.Restarts.Load(), c.StoreRestarts.Load())
	failover := ""
	if len(h.kills) > 1 {
		var per []string
		for i, n := range h.kills {
			per = append(per, fmt.Sprintf("replica %d: %d", i, n))
		}
		kills = fmt.Sprintf("%d kill -9 (%s; %d restarts, %d database restarts)", c.Kills.Load(), strings.Join(per, ", "),
			c.Restarts.Load(), c.StoreRestarts.Load())
		failover = fmt.Sprintf(", %d calls failed over to the other replica, %d agent moves", c.Failovers.Load(), c.AgentMoves.Load())
	}
	fmt.Fprintf(out, "load: %s, %d agents enrolled, %d agent connections, %d provisions, %d tasks created, %d finished by agents, %d claims, %d releases, %d terminates, %d machines crashed, %d dropped calls, %d watcher streams, %d replayed tokens, %d call errors (expected while tetherd is down)%s\n",
		kills, len(l.Enrollments), c.AgentsConnected.Load(), c.Provisions.Load(), len(l.Tasks), c.TasksFinished.Load(),
		len(l.Claims), len(l.Releases), len(l.Terminates), len(l.Deaths), c.Drops.Load(), len(l.Live), l.Replays, c.CallErrors.Load(), failover)
	fmt.Fprintf(out, "call errors by code: %v\n", h.errCodes)
	for c, err := range h.firstErr {
		if !expectedRefusals[c] && c != codes.Unknown {
			fmt.Fprintf(out, "first %s: %v\n", c, err)
		}
	}
	if h.unknown != nil {
		fmt.Fprintf(out, "first error without a gRPC status (counted as Unknown): %v\n", h.unknown)
	}
	states := map[string]int{}
	for _, in := range o.Instances {
		states[in.Status]++
	}
	fmt.Fprintf(out, "after recovery: %d instances by state %v, %d fake machines, %d events, %d tasks\n",
		len(o.Instances), states, len(o.Machines), len(o.Events), len(o.Tasks))
	for _, r := range res {
		fmt.Fprintln(out, r)
		for i, v := range r.Violations {
			if i == 20 {
				fmt.Fprintf(out, "    ... and %d more\n", len(r.Violations)-20)
				break
			}
			fmt.Fprintln(out, "    "+v)
		}
	}
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
	if _, err := tinymodule.Push(ctx, admin, tag, "1", tinymodule.Image()); err != nil {
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
	cfg Config
	// admins are one admin client per replica (one without replicas).
	admins       []v1.AdminServiceClient
	dl           *dialer
	ledger       *Ledger
	c            *Counters
	node         string
	pools        []string
	machinesFile string
	// kills counts the kill -9s of each replica; only the killer and the
	// recovery, both on Run's goroutine, touch it.
	kills []int

	mu       sync.Mutex
	agents   map[string]bool // machine id + token already booted
	errCodes map[codes.Code]int
	// firstErr is the first error of each code, printed for the codes the
	// load does not provoke by itself: what a failed invariant points at.
	firstErr map[codes.Code]error
	// unknown is the first error that carried no gRPC status (Unknown):
	// tetherd never answers with Unknown, so it names what did.
	unknown error
	running []string // instances whose agent reported ready
	// killAgent ends an instance's simulated agent (the crasher's dead
	// machine takes its agent with it).
	killAgent map[string]context.CancelFunc
	// backup is the backup taken half-way (Config.Backup; nil without).
	backup  *backupRun
	cancels []context.CancelFunc
	agentWG sync.WaitGroup
}

// errorCodes copies the count of call errors by code.
func (h *harness) errorCodes() map[codes.Code]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.errCodes)
}

func (h *harness) callErr(err error) {
	if err != nil {
		h.c.CallErrors.Add(1)
		h.mu.Lock()
		c := status.Code(err)
		h.errCodes[c]++
		if _, seen := h.firstErr[c]; !seen {
			h.firstErr[c] = err
		}
		if c == codes.Unknown && h.unknown == nil {
			h.unknown = err
		}
		h.mu.Unlock()
	}
}

// call bounds one call of the load.
func (h *harness) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, 10*time.Second)
}

// adminCall makes one admin call on a replica picked at random and, when
// that one answers Unavailable (it is down), on the next, the way a client
// behind a load balancer fails over. Each failed attempt but the last is
// counted here; the caller counts the last and records the call in the
// ledger only when it returned OK. An Unavailable attempt may still have
// committed (killed before it answered): its retry is then a second call,
// as a client's would be, and only the acknowledged one is recorded.
func (h *harness) adminCall(ctx context.Context, f func(context.Context, v1.AdminServiceClient) error) error {
	first := mrand.IntN(len(h.admins))
	for k := 0; ; k++ {
		cctx, cancel := h.call(ctx)
		err := f(cctx, h.admins[(first+k)%len(h.admins)])
		cancel()
		if err == nil {
			if k > 0 {
				h.c.Failovers.Add(1)
			}
			return nil
		}
		if status.Code(err) != codes.Unavailable || k == len(h.admins)-1 {
			return err
		}
		h.callErr(err)
	}
}

// next is the replica an agent turns to when cur failed it: the next in
// its list, as the real agent moves along tether.url=URL1,URL2
// (docs/design.md §3.2).
func (h *harness) next(cur int) int {
	if len(h.admins) == 1 {
		return cur
	}
	h.c.AgentMoves.Add(1)
	return (cur + 1) % len(h.admins)
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
			go func() { defer h.agentWG.Done(); h.agent(actx, cancel, m.Enrollment.Token) }()
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
func (h *harness) agent(ctx context.Context, cancel context.CancelFunc, token string) {
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
	// The replay below is somebody else's: the token with another key.
	// The agent's own retry (same token, same key) after an answer lost in
	// a kill is the same enrollment and is answered (design §3.3).
	_, other, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		h.callErr(err)
		return
	}
	otherDER, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, other)
	if err != nil {
		h.callErr(err)
		return
	}
	otherCSR := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: otherDER}))
	conns, err := h.dl.dialAll(nil)
	if err != nil {
		h.callErr(err)
		return
	}
	defer closeAll(conns)
	// Agents start spread over the replicas and stay on the one that
	// answered until it fails them.
	cur := mrand.IntN(len(conns))
	sum := sha256.Sum256([]byte(token))
	var resp *v1.EnrollResponse
	for resp == nil {
		cctx, cancel := h.call(ctx)
		resp, err = v1.NewEnrollmentServiceClient(conns[cur]).Enroll(cctx, &v1.EnrollRequest{Token: token, CsrPem: csr})
		cancel()
		if err != nil {
			h.callErr(err)
			if c := status.Code(err); c != codes.Unavailable && c != codes.DeadlineExceeded || ctx.Err() != nil {
				return // refused (spent by another key, expired, terminated); the instance's boot timeout owns it
			}
			cur = h.next(cur)
			if !sleep(ctx, 500*time.Millisecond) {
				return
			}
		}
	}
	h.ledger.Enroll(Enrollment{InstanceID: resp.InstanceId, TokenHash: hex.EncodeToString(sum[:])})
	h.mu.Lock()
	h.killAgent[resp.InstanceId] = cancel
	h.mu.Unlock()
	h.c.AgentsEnrolled.Add(1)
	if mrand.IntN(4) == 0 {
		// The replay goes to another replica when there is one: a token
		// spent on one must be spent on all.
		cctx, cancel := h.call(ctx)
		_, rerr := v1.NewEnrollmentServiceClient(conns[(cur+1)%len(conns)]).Enroll(cctx, &v1.EnrollRequest{Token: token, CsrPem: otherCSR})
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
	h.backup.enrolled(resp.InstanceId, cert)
	aconns, err := h.dl.dialAll(&cert)
	if err != nil {
		h.callErr(err)
		return
	}
	defer closeAll(aconns)
	first := true
	for ctx.Err() == nil {
		if err := h.stream(ctx, v1.NewAgentServiceClient(aconns[cur]), resp.InstanceId, &first); err != nil {
			if c := status.Code(err); c == codes.PermissionDenied || c == codes.Unauthenticated || c == codes.NotFound {
				return // terminated: the certificate no longer opens a stream
			}
			h.callErr(err)
			cur = h.next(cur)
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
	// A Send that fails with io.EOF means the server ended the stream, and
	// Recv then returns its status (gRPC's contract); a clean end (Recv's
	// io.EOF) is no error, the agent just reconnects. Counted as it came,
	// either showed as a call failed Unknown with the error "EOF".
	ended := func(err error) error {
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	}
	if err := hb(); err != nil {
		if errors.Is(err, io.EOF) {
			_, err = s.Recv()
			return ended(err)
		}
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
				errc <- ended(err)
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
				if errors.Is(err, io.EOF) {
					return <-errc
				}
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
		err := h.adminCall(ctx, func(ctx context.Context, admin v1.AdminServiceClient) error {
			_, err := admin.ProvisionInstance(ctx, &v1.ProvisionInstanceRequest{Node: h.node, Provider: fake.Name})
			return err
		})
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

// crasher kills a random running machine every few seconds behind the
// control plane's back, as a SIGKILLed QEMU: its agent's stream ends and
// the fake provider reports it stopped from then on. No claim may hand
// it out after that (noDeadClaimed).
func (h *harness) crasher(ctx context.Context) {
	fp, err := fake.Open(h.machinesFile)
	for err != nil {
		if !sleep(ctx, time.Second) {
			return
		}
		fp, err = fake.Open(h.machinesFile)
	}
	for sleep(ctx, time.Duration(2000+mrand.IntN(2000))*time.Millisecond) {
		id := h.randomRunning()
		h.mu.Lock()
		kill := h.killAgent[id]
		delete(h.killAgent, id)
		h.mu.Unlock()
		if id == "" || kill == nil {
			continue
		}
		kill()
		if !fp.SetState(fake.MachineID(id), providers.StateStopped) {
			continue // terminated meanwhile: nothing died
		}
		h.ledger.Die(Death{InstanceID: id, At: time.Now()})
		h.c.Crashes.Add(1)
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
		err := h.adminCall(ctx, func(ctx context.Context, admin v1.AdminServiceClient) error {
			_, err := admin.TerminateInstance(ctx, &v1.InstanceActionRequest{Id: id})
			return err
		})
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
		var t *v1.Task
		err := h.adminCall(ctx, func(ctx context.Context, admin v1.AdminServiceClient) error {
			var err error
			t, err = admin.CreateTask(ctx, &v1.CreateTaskRequest{InstanceId: id, Kind: v1.TaskKind_TASK_KIND_EXEC,
				Exec: &v1.ExecPayload{Argv: []string{"true"}}})
			return err
		})
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
		var r *v1.AcquirePoolMemberResponse
		asked := time.Now()
		err := h.adminCall(ctx, func(ctx context.Context, admin v1.AdminServiceClient) error {
			var err error
			r, err = admin.AcquirePoolMember(ctx, &v1.AcquirePoolMemberRequest{PoolName: pool, AcquiredBy: "chaos"})
			return err
		})
		if err != nil {
			h.callErr(err)
			continue
		}
		h.ledger.Claim(Claim{ClaimID: r.ClaimId, InstanceID: r.Instance.GetId(), PoolID: r.PoolId, Asked: asked, Acked: time.Now()})
		sleep(ctx, time.Duration(mrand.IntN(2000))*time.Millisecond)
		for attempt := 0; attempt < 50; attempt++ {
			// The release must go out even as the run ends: a claim left
			// open is not a broken invariant, but it is not the load asked.
			err := h.adminCall(context.Background(), func(ctx context.Context, admin v1.AdminServiceClient) error {
				_, err := admin.ReleasePoolMember(ctx, &v1.ReleasePoolMemberRequest{InstanceId: r.Instance.GetId()})
				return err
			})
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
	// In a rolling upgrade's middle the dropper cuts calls to the newest
	// build only: builds before the commit-after-cancel fix (sqlstore's
	// commitErr) log a call canceled mid-commit as an internal error,
	// which MixedBuilds would count against the upgrade.
	first := 0
	if h.cfg.OldTetherd != "" && len(h.admins) > 1 {
		first = 1
	}
	for sleep(ctx, time.Duration(50+mrand.IntN(200))*time.Millisecond) {
		conn, err := h.dl.dial(first+mrand.IntN(len(h.admins)-first), &h.dl.admin)
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
				rctx, rcancel := h.call(ctx)
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

// watcher follows the event stream from replica cur, opening a new one
// after every kill: on the same tetherd when it is alone (it waits for it
// to come back), on the next replica when there are several.
func (h *harness) watcher(ctx context.Context, cur int) {
	alone := len(h.admins) == 1
	for ctx.Err() == nil {
		s, err := h.admins[cur].WatchEvents(ctx, &v1.WatchEventsRequest{}, grpc.WaitForReady(alone))
		if err != nil {
			h.callErr(err)
			cur = (cur + 1) % len(h.admins)
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
		cur = (cur + 1) % len(h.admins)
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
