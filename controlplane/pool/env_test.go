package pool_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/pool"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/postgres"
	"github.com/tetherfleet/tether/controlplane/worker"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/testkit/instancestest"
	"github.com/tetherfleet/tether/internal/testkit/pgtest"
	"github.com/tetherfleet/tether/providers/fake"
)

// pg is the PostgreSQL server this test binary shares (fsync off);
// pgDurable (fsync on, like SQLite's synchronous=FULL) is started only by
// the benchmarks. Each test gets a fresh database.
var (
	pg        pgtest.Shared
	pgDurable = pgtest.Shared{Options: pgtest.Options{Durable: true}}
)

func TestMain(m *testing.M) {
	code := m.Run()
	pg.Close()
	pgDurable.Close()
	os.Exit(code)
}

var t0 = instancestest.T0

// backend opens a fresh store of one kind for a test.
type backend struct {
	name string
	open func(t testing.TB) store.Store
}

func openPostgres(sh *pgtest.Shared) func(t testing.TB) store.Store {
	return func(t testing.TB) store.Store {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		s, err := postgres.Open(ctx, sh.DSN(t), postgres.Options{MaxConns: 48})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
}

var backends = []backend{{"sqlite", instancestest.SQLite}, {"postgres", openPostgres(&pg)}}

// eachBackend runs f once per store backend.
func eachBackend(t *testing.T, f func(t *testing.T, open func(testing.TB) store.Store)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { f(t, b.open) })
	}
}

// env is a control plane without its API: a store, the fake provider, a
// fake clock, the instance and pool services and a worker the test drives.
type env struct {
	t    testing.TB
	ctx  context.Context
	st   store.Store
	clk  *clock.Fake
	fake *fake.Provider
	inst *instances.Service
	svc  *pool.Service
	wk   *worker.Worker
	tpl  *store.Template
	logs *instancestest.LogBuffer
}

func newEnv(t testing.TB, open func(testing.TB) store.Store) *env {
	t.Helper()
	f := instancestest.New(t, open(t), instancestest.Options{Owner: "pool-test", ProvisionAttempts: 1, Timeout: 120 * time.Second})
	return &env{t: t, ctx: f.Ctx, st: f.Store, clk: f.Clock, fake: f.Fake, inst: f.Instances, svc: f.Services.Pools, wk: f.Worker, tpl: f.Template, logs: f.Logs}
}

// create makes a pool on the fake provider.
func (e *env) create(name string, target int, meta store.PoolMetadata) *store.Pool {
	e.t.Helper()
	v, err := e.svc.Create(e.ctx, pool.CreateParams{Name: name, Template: e.tpl.Name, Provider: fake.Name, TargetSize: target, Metadata: meta})
	if err != nil {
		e.t.Fatal(err)
	}
	return v.Pool
}

func (e *env) pool(name string) *store.Pool {
	e.t.Helper()
	p, err := e.st.GetPool(e.ctx, name)
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

// work runs the worker until no task is left.
func (e *env) work() {
	e.t.Helper()
	for {
		ran, err := e.wk.RunOnce(e.ctx)
		if err != nil {
			e.t.Logf("worker: %v", err)
		}
		if !ran {
			return
		}
	}
}

// members lists a pool's members in the given pool states (all if none),
// terminated ones included.
func (e *env) members(p *store.Pool, states ...lifecycle.PoolState) []*store.Instance {
	e.t.Helper()
	ins, err := e.st.ListInstances(e.ctx, store.InstanceFilter{PoolID: p.ID, PoolStates: states}, store.Page{Limit: store.MaxPageSize})
	if err != nil {
		e.t.Fatal(err)
	}
	return ins
}

// live lists members that are not terminated.
func (e *env) live(p *store.Pool, states ...lifecycle.PoolState) []*store.Instance {
	var out []*store.Instance
	for _, in := range e.members(p, states...) {
		if in.Status != lifecycle.Terminated {
			out = append(out, in)
		}
	}
	return out
}

func (e *env) counts(p *store.Pool) store.PoolCounts {
	e.t.Helper()
	c, err := e.st.CountPoolMembers(e.ctx, p.ID)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// ready plays the agent of a warming member: phase=ready, with the pool's
// hook, as the agent API does.
func (e *env) ready(id store.InstanceID) {
	e.t.Helper()
	if err := e.inst.AgentReady(e.ctx, id, e.svc.ReadyHook); err != nil {
		e.t.Fatal(err)
	}
	present(e.t, e.ctx, e.st, id)
}

// present records the agent of id as connected, with a lease that outlasts
// any test's fake clock: a claim takes only members whose agent is there.
func present(t testing.TB, ctx context.Context, q store.Queries, id store.InstanceID) {
	t.Helper()
	if err := q.OpenPresence(ctx, &store.Presence{InstanceID: id, Replica: "pool-test", StreamID: "s-" + id.String(), ConnectedAt: t0,
		LeaseUntil: t0.Add(100 * 365 * 24 * time.Hour)}); err != nil {
		t.Fatal(err)
	}
}

// warm replenishes a pool, provisions its members and reports them ready.
func (e *env) warm(p *store.Pool) []*store.Instance {
	e.t.Helper()
	if _, _, err := e.svc.Replenish(e.ctx, p.Name); err != nil {
		e.t.Fatal(err)
	}
	e.work()
	for _, in := range e.live(p, lifecycle.PoolWarming) {
		e.ready(in.ID)
	}
	return e.live(p, lifecycle.PoolReady)
}

// heartbeat records a heartbeat for an instance at the clock's now.
func (e *env) heartbeat(id store.InstanceID) {
	e.t.Helper()
	if err := e.st.RecordHeartbeats(e.ctx, []store.Heartbeat{{InstanceID: id, At: e.clk.Now(), Phase: "ready", Addresses: []string{"10.0.0.9"}}}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) get(id store.InstanceID) *store.Instance {
	e.t.Helper()
	in, err := e.st.GetInstance(e.ctx, id)
	if err != nil {
		e.t.Fatal(err)
	}
	return in
}

// events lists events of a kind (all if ""), oldest first.
func (e *env) events(kind store.EventKind, f store.EventFilter) []*store.Event {
	e.t.Helper()
	f.Kind = kind
	evs, err := e.st.ListEvents(e.ctx, f, store.Page{Limit: store.MaxPageSize})
	if err != nil {
		e.t.Fatal(err)
	}
	for i, j := 0, len(evs)-1; i < j; i, j = i+1, j-1 {
		evs[i], evs[j] = evs[j], evs[i]
	}
	return evs
}

var seeded atomic.Int64

// seedReady writes n ready, running members straight into the store (the
// concurrency tests and the benchmark need many, fast), each on its own
// node, oldest first by warming start.
func seedReady(t testing.TB, ctx context.Context, st store.Store, p *store.Pool, n int) []*store.Instance {
	t.Helper()
	out := make([]*store.Instance, 0, n)
	const chunk = 250
	for start := 0; start < n; start += chunk {
		err := st.Tx(ctx, func(q store.Queries) error {
			for i := start; i < min(n, start+chunk); i++ {
				seq := seeded.Add(1)
				node := &store.Node{Name: fmt.Sprintf("%s-seed-%06d", p.Name, seq), TemplateID: p.TemplateID, Enabled: true,
					Config: []byte("{}"), CreatedAt: t0, UpdatedAt: t0}
				if err := q.CreateNode(ctx, node); err != nil {
					return err
				}
				// Later seeds are younger, so "oldest first" is well defined.
				w := t0.Add(time.Duration(seq) * time.Millisecond)
				in := &store.Instance{NodeID: node.ID, Status: lifecycle.Running, Provider: fake.Name,
					CloudInstanceID: fmt.Sprintf("seed-%s-%d", p.Name, i), CreatedAt: w, UpdatedAt: w, PoolMember: store.PoolMember{PoolID: p.ID, PoolState: lifecycle.PoolReady, PoolWarmingStartedAt: &w, PoolReadyAt: &w}, AgentReport: store.AgentReport{LastHeartbeatAt: &w, Addresses: []string{fmt.Sprintf("10.1.%d.%d", i/250, i%250)}}}
				if err := q.CreateInstance(ctx, in); err != nil {
					return err
				}
				present(t, ctx, q, in.ID)
				out = append(out, in)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

type instancesProvision = instances.ProvisionParams

func wantCode(t testing.TB, err error, want codes.Code) {
	t.Helper()
	if got := fail.Code(err); got != want || (err == nil) != (want == codes.OK) {
		t.Fatalf("got %v (%v), want %v", got, err, want)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// payload reads an event's payload.
func payload(t testing.TB, ev *store.Event) map[string]any {
	t.Helper()
	m := map[string]any{}
	if err := json.Unmarshal(ev.Payload, &m); err != nil {
		t.Fatal(err)
	}
	return m
}
