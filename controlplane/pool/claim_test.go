package pool_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/pool"
	"github.com/tetherfleet/tether/controlplane/pool/claims"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/tasks"
	"github.com/tetherfleet/tether/internal/testkit/instancestest"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/fake"
)

// 32 claimers, 20 ready members: exactly 20 distinct claims and 12
// NoReadyMembers, every round, on both stores.
func TestAcquireRace(t *testing.T) {
	eachBackend(t, func(t *testing.T, open func(testing.TB) store.Store) {
		e := newEnv(t, open)
		for round := 0; round < 5; round++ {
			p := e.create("race"+string(rune('a'+round)), 0, store.PoolMetadata{})
			seedReady(t, e.ctx, e.st, p, 20)
			claims, exhausted := race(t, e.ctx, 32, func(i int) (*pool.Claim, error) {
				return e.svc.Acquire(e.ctx, pool.AcquireParams{PoolName: p.Name, AcquiredBy: "claimer", AcquiredFor: "race"})
			})
			if len(claims) != 20 || exhausted != 12 {
				t.Fatalf("round %d: %d claims, %d exhausted; want 20 and 12", round, len(claims), exhausted)
			}
			if c := e.counts(p); c.Claimed != 20 || c.Ready != 0 {
				t.Fatalf("round %d: counts %+v", round, c)
			}
			if evs := e.events(events.PoolClaimed, store.EventFilter{PoolID: p.ID}); len(evs) != 20 {
				t.Fatalf("round %d: %d claim events for 20 claims", round, len(evs))
			}
		}
	})
}

// race runs n claimers at once and returns the distinct members claimed
// and how many were told NoReadyMembers. A member claimed twice, or any
// other error, fails the test.
func race(t *testing.T, ctx context.Context, n int, acquire func(i int) (*pool.Claim, error)) (map[store.InstanceID]store.ClaimID, int) {
	t.Helper()
	var mu sync.Mutex
	got := map[store.InstanceID]store.ClaimID{}
	exhausted := 0
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			c, err := acquire(i)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				if prev, dup := got[c.Instance.ID]; dup {
					t.Errorf("member %s claimed twice (claims %s and %s)", c.Instance.ID, prev, c.ID)
				}
				got[c.Instance.ID] = c.ID
			case fail.Code(err) == codes.ResourceExhausted && strings.Contains(err.Error(), "NoReadyMembers"):
				exhausted++
			default:
				t.Errorf("acquire: %v", err)
			}
		}(i)
	}
	close(start)
	wg.Wait()
	return got, exhausted
}

// failingStore fails AppendEvent of one kind inside transactions: the
// ledger that records a claim is unavailable.
type failingStore struct {
	store.Store
	kind store.EventKind
}

func (f failingStore) Tx(ctx context.Context, fn func(store.Queries) error) error {
	return f.Store.Tx(ctx, func(q store.Queries) error { return fn(failingQueries{q, f.kind}) })
}

type failingQueries struct {
	store.Queries
	kind store.EventKind
}

var errLedger = errors.New("event log unavailable")

func (f failingQueries) AppendEvent(ctx context.Context, e *store.Event) error {
	if e.Kind == f.kind {
		return errLedger
	}
	return f.Queries.AppendEvent(ctx, e)
}

func (f failingQueries) AppendEvents(ctx context.Context, es []*store.Event) error {
	for _, e := range es {
		if e.Kind == f.kind {
			return errLedger
		}
	}
	return f.Queries.AppendEvents(ctx, es)
}

// gatedStore holds the first transaction until release is closed, so
// the claims that arrive meanwhile queue into one batch, and counts the
// transactions and the member counts that explain a refusal.
type gatedStore struct {
	store.Store
	entered, release chan struct{}
	once             sync.Once
	txs, counts      atomic.Int32
	// countGate, when set, holds every member count until it is closed.
	countGate chan struct{}
}

func newGatedStore(st store.Store) *gatedStore {
	return &gatedStore{Store: st, entered: make(chan struct{}), release: make(chan struct{})}
}

func (g *gatedStore) Tx(ctx context.Context, fn func(store.Queries) error) error {
	g.txs.Add(1)
	g.once.Do(func() { close(g.entered); <-g.release })
	return g.Store.Tx(ctx, fn)
}

func (g *gatedStore) CountPoolMembers(ctx context.Context, id store.PoolID) (store.PoolCounts, error) {
	g.counts.Add(1)
	if g.countGate != nil {
		<-g.countGate
	}
	return g.Store.CountPoolMembers(ctx, id)
}

// claimInBatch runs the first of ps alone, held in its transaction, and
// the rest as one batch queued behind it (one claim lane), and returns
// each claim's answer, aligned with ps.
func claimInBatch(t *testing.T, e *env, g *gatedStore, ps ...pool.AcquireParams) ([]*pool.Claim, []error) {
	t.Helper()
	claims, errs := make([]*pool.Claim, len(ps)), make([]error, len(ps))
	for a := range startBatch(t, e, g, ps...) {
		claims[a.i], errs[a.i] = a.claim, a.err
	}
	return claims, errs
}

// answer is one claim's, for startBatch.
type answer struct {
	i     int
	claim *pool.Claim
	err   error
}

// startBatch is claimInBatch with the answers sent as they come; the
// channel closes after the last.
func startBatch(t *testing.T, e *env, g *gatedStore, ps ...pool.AcquireParams) <-chan answer {
	t.Helper()
	svc := &pool.Service{Store: g, Clock: e.clk, Log: e.svc.Log, Instances: e.inst, ClaimLanes: 1}
	out := make(chan answer, len(ps))
	var wg sync.WaitGroup
	acquire := func(i int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := svc.Acquire(e.ctx, ps[i])
			out <- answer{i, c, err}
		}()
	}
	acquire(0)
	<-g.entered
	for i := 1; i < len(ps); i++ {
		acquire(i)
	}
	// The queue is the batcher's own state; nothing signals its growth.
	for pool.QueuedClaims(svc) < len(ps)-1 {
		runtime.Gosched()
	}
	close(g.release)
	go func() { wg.Wait(); close(out) }()
	return out
}

// A batch of claims shares its pool's refusal: each caller gets it from
// the batch's one transaction, with no retry one by one, and nothing is
// claimed.
func TestBatchedClaimsShareTheirPoolsRefusal(t *testing.T) {
	eachBackend(t, func(t *testing.T, open func(testing.TB) store.Store) {
		e := newEnv(t, open)
		p := e.create("ci", 0, store.PoolMetadata{})
		seeded := seedReady(t, e.ctx, e.st, p, 4)
		if _, err := e.svc.Drain(e.ctx, "ci"); err != nil {
			t.Fatal(err)
		}
		g := newGatedStore(e.st)
		_, errs := claimInBatch(t, e, g, pool.AcquireParams{PoolName: "ci"}, pool.AcquireParams{PoolName: "ci"}, pool.AcquireParams{PoolName: "ci"},
			pool.AcquireParams{PoolName: "ci"}, pool.AcquireParams{PoolName: "ci"}, pool.AcquireParams{PoolName: "ci"})
		for _, err := range errs {
			wantCode(t, err, codes.FailedPrecondition)
		}
		if n := g.txs.Load(); n != 2 {
			t.Errorf("%d transactions for a lone claim and a refused batch of 5, want 2", n)
		}
		for _, m := range seeded {
			if got := e.get(m.ID); got.ClaimID != "" {
				t.Fatalf("member %s of a draining pool was claimed", m.ID)
			}
		}
	})
}

// The claims of a batch that found no ready member share one explanation:
// the pool's members are counted once for the batch, not once per caller.
func TestBatchedClaimsCountAnEmptyPoolOnce(t *testing.T) {
	eachBackend(t, func(t *testing.T, open func(testing.TB) store.Store) {
		e := newEnv(t, open)
		p := e.create("ci", 0, store.PoolMetadata{})
		seedReady(t, e.ctx, e.st, p, 2)
		g := newGatedStore(e.st)
		ps := make([]pool.AcquireParams, 6)
		for i := range ps {
			ps[i] = pool.AcquireParams{PoolName: "ci", AcquiredBy: fmt.Sprintf("c%d", i)}
		}
		claims, errs := claimInBatch(t, e, g, ps...)
		got := 0
		for i, err := range errs {
			if err == nil {
				got++
				if claims[i].Instance.AcquiredBy != ps[i].AcquiredBy {
					t.Errorf("claim %d went to %q", i, claims[i].Instance.AcquiredBy)
				}
				continue
			}
			wantCode(t, err, codes.ResourceExhausted)
			if !strings.Contains(err.Error(), "claimed 2") {
				t.Errorf("refusal %d does not count the claimed members: %v", i, err)
			}
		}
		if got != 2 {
			t.Fatalf("%d claims succeeded of 2 ready members", got)
		}
		if n := g.counts.Load(); n != 1 {
			t.Errorf("the pool's members were counted %d times for one batch's refusals, want 1", n)
		}
	})
}

// A claim of a batch that got its member is answered without waiting
// for the count that explains the batch's refusals.
func TestBatchedClaimsDoNotWaitForTheRefusalsCount(t *testing.T) {
	e := newEnv(t, instancestest.SQLite)
	p := e.create("ci", 0, store.PoolMetadata{})
	seedReady(t, e.ctx, e.st, p, 2)
	g := newGatedStore(e.st)
	g.countGate = make(chan struct{})
	ps := make([]pool.AcquireParams, 4)
	for i := range ps {
		ps[i] = pool.AcquireParams{PoolName: "ci"}
	}
	// The lone first claim and one of the batch of three get the two
	// members; the other two wait on the count.
	answers := startBatch(t, e, g, ps...)
	release := sync.OnceFunc(func() { close(g.countGate) })
	defer release()
	deadline := time.After(30 * time.Second)
	for got := 0; got < 2; got++ {
		select {
		case a := <-answers:
			if a.err != nil {
				t.Fatalf("claim %d answered before the count was let through: %v", a.i, a.err)
			}
		case <-deadline:
			t.Fatalf("%d of the 2 claims that got a member were answered while the refusals' count was held", got)
		}
	}
	release()
	refused := 0
	for a := range answers {
		wantCode(t, a.err, codes.ResourceExhausted)
		refused++
	}
	if refused != 2 || g.counts.Load() != 1 {
		t.Fatalf("%d refused, %d counts; want 2 refused on one count", refused, g.counts.Load())
	}
}

// nodeNamesFail fails the read that names the claimed members' nodes.
type nodeNamesFail struct{ store.Store }

func (f nodeNamesFail) Tx(ctx context.Context, fn func(store.Queries) error) error {
	return f.Store.Tx(ctx, func(q store.Queries) error { return fn(nodeNamesFailQ{q}) })
}

type nodeNamesFailQ struct{ store.Queries }

func (nodeNamesFailQ) NodeNames(context.Context, []store.NodeID) (map[store.NodeID]string, error) {
	return nil, errNodeNames
}

var errNodeNames = errors.New("nodes table unreadable")

// A claim whose answer cannot be completed (its node's name) is rolled
// back, not handed out without it.
func TestClaimRollsBackWhenItsNodeNameFails(t *testing.T) {
	e := newEnv(t, instancestest.SQLite)
	p := e.create("ci", 0, store.PoolMetadata{})
	m := seedReady(t, e.ctx, e.st, p, 1)[0]
	broken := &pool.Service{Store: nodeNamesFail{e.st}, Clock: e.clk, Log: e.svc.Log, Instances: e.inst}
	if _, err := broken.Acquire(e.ctx, pool.AcquireParams{PoolName: "ci"}); !errors.Is(err, errNodeNames) {
		t.Fatalf("acquire with unreadable node names: %v", err)
	}
	if got := e.get(m.ID); got.PoolState != lifecycle.PoolReady || got.ClaimID != "" {
		t.Fatalf("the claim was kept: %s %q", got.PoolState, got.ClaimID)
	}
	c, err := e.svc.Acquire(e.ctx, pool.AcquireParams{PoolName: "ci"})
	must(t, err)
	if c.NodeName == "" || c.Instance.ID != m.ID {
		t.Fatalf("claim: member %s node %q", c.Instance.ID, c.NodeName)
	}
}

// A claim the ledger cannot record is rolled back, not handed out.
func TestClaimRollsBackWhenItsEventFails(t *testing.T) {
	eachBackend(t, func(t *testing.T, open func(testing.TB) store.Store) {
		e := newEnv(t, open)
		p := e.create("ci", 0, store.PoolMetadata{})
		seeded := seedReady(t, e.ctx, e.st, p, 1)[0]
		broken := &pool.Service{Store: failingStore{Store: e.st, kind: events.PoolClaimed}, Clock: e.clk, Log: e.svc.Log, Instances: e.inst}
		_, err := broken.Acquire(e.ctx, pool.AcquireParams{PoolName: "ci", AcquiredBy: "alice"})
		if !errors.Is(err, errLedger) {
			t.Fatalf("acquire with a broken ledger: %v", err)
		}
		in := e.get(seeded.ID)
		if in.PoolState != lifecycle.PoolReady || in.ClaimID != "" || in.AcquiredBy != "" || in.PoolAcquiredAt != nil {
			t.Fatalf("the claim was kept: state %s claim %q by %q", in.PoolState, in.ClaimID, in.AcquiredBy)
		}
		// The same for claims that share a batch: none is handed out.
		more := seedReady(t, e.ctx, e.st, p, 5)
		var wg sync.WaitGroup
		for i := 0; i < 6; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := broken.Acquire(e.ctx, pool.AcquireParams{PoolName: "ci"}); !errors.Is(err, errLedger) {
					t.Errorf("batched acquire with a broken ledger: %v", err)
				}
			}()
		}
		wg.Wait()
		for _, m := range append(more, seeded) {
			if got := e.get(m.ID); got.PoolState != lifecycle.PoolReady || got.ClaimID != "" {
				t.Fatalf("member %s kept a claim the ledger did not record: %s", m.ID, got.PoolState)
			}
		}
		// With the ledger back, the oldest member is claimed and recorded.
		c, err := e.svc.Acquire(e.ctx, pool.AcquireParams{PoolName: "ci", AcquiredBy: "alice"})
		must(t, err)
		if c.Instance.ID != seeded.ID || len(e.events(events.PoolClaimed, store.EventFilter{})) != 1 {
			t.Fatalf("claim after recovery: %s", c.Instance.ID)
		}
	})
}

func TestAcquireSelection(t *testing.T) {
	e := newEnv(t, instancestest.SQLite)
	eph := e.create("eph", 0, store.PoolMetadata{})
	spot, err := e.svc.Create(e.ctx, pool.CreateParams{Name: "spot", Template: "tpl", Provider: fake.Name, LifecycleClass: store.ClassSpot})
	must(t, err)
	ephMembers := seedReady(t, e.ctx, e.st, eph, 3)
	spotMembers := seedReady(t, e.ctx, e.st, spot.Pool, 2)

	// pool_id wins over pool_name; the oldest ready member goes first; the
	// claim carries its attribution on the row and in the event.
	c, err := e.svc.Acquire(e.ctx, pool.AcquireParams{PoolID: spot.Pool.ID, PoolName: "eph", AcquiredBy: "ci-job-1", AcquiredFor: "build-7"})
	must(t, err)
	if c.Pool.Name != "spot" || c.Instance.ID != spotMembers[0].ID || c.ID == "" || c.NodeName == "" || len(c.Instance.Addresses) == 0 {
		t.Fatalf("claim: pool %s member %s id %q node %q addrs %v", c.Pool.Name, c.Instance.ID, c.ID, c.NodeName, c.Instance.Addresses)
	}
	in := e.get(c.Instance.ID)
	if in.PoolState != lifecycle.PoolClaimed || in.ClaimID != c.ID || in.AcquiredBy != "ci-job-1" || in.AcquiredFor != "build-7" ||
		in.PoolAcquiredAt == nil {
		t.Fatalf("claimed row: %+v", in)
	}
	evs := e.events(events.PoolClaimed, store.EventFilter{CorrelationID: c.ID.Correlation()})
	if len(evs) != 1 {
		t.Fatalf("%d claim events", len(evs))
	}
	pl := payload(t, evs[0])
	if pl["claim_id"] != c.ID.String() || pl["acquired_by"] != "ci-job-1" || pl["acquired_for"] != "build-7" || pl["pool_name"] != "spot" {
		t.Fatalf("claim event payload: %v", pl)
	}

	// pool_name, then any active pool narrowed by class.
	c, err = e.svc.Acquire(e.ctx, pool.AcquireParams{PoolName: "eph"})
	must(t, err)
	if c.Instance.ID != ephMembers[0].ID {
		t.Fatalf("by name: %s, want the oldest %s", c.Instance.ID, ephMembers[0].ID)
	}
	c, err = e.svc.Acquire(e.ctx, pool.AcquireParams{LifecycleClass: store.ClassSpot})
	must(t, err)
	if c.Pool.Name != "spot" {
		t.Fatalf("by class: pool %s", c.Pool.Name)
	}
	_, err = e.svc.Acquire(e.ctx, pool.AcquireParams{LifecycleClass: store.ClassSpot})
	wantCode(t, err, codes.ResourceExhausted)
	c, err = e.svc.Acquire(e.ctx, pool.AcquireParams{})
	must(t, err)
	if c.Pool.Name != "eph" {
		t.Fatalf("any pool: %s", c.Pool.Name)
	}
	// A paused pool hands out nothing, even when asked for by name.
	if _, err := e.svc.Pause(e.ctx, "eph"); err != nil {
		t.Fatal(err)
	}
	_, err = e.svc.Acquire(e.ctx, pool.AcquireParams{PoolName: "eph"})
	wantCode(t, err, codes.FailedPrecondition)
	_, err = e.svc.Acquire(e.ctx, pool.AcquireParams{})
	wantCode(t, err, codes.ResourceExhausted)
}

func TestAcquireValidation(t *testing.T) {
	e := newEnv(t, instancestest.SQLite)
	e.create("eph", 0, store.PoolMetadata{})
	drained := e.create("drained", 0, store.PoolMetadata{})
	seedReady(t, e.ctx, e.st, drained, 1)
	if _, err := e.svc.Drain(e.ctx, "drained"); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 257)
	tests := []struct {
		name  string
		p     pool.AcquireParams
		code  codes.Code
		field string
	}{
		{"unknown class", pool.AcquireParams{LifecycleClass: "cheap"}, codes.InvalidArgument, "lifecycle_class"},
		{"class mismatch", pool.AcquireParams{PoolName: "eph", LifecycleClass: store.ClassSpot}, codes.InvalidArgument, "lifecycle_class"},
		{"long acquired_by", pool.AcquireParams{AcquiredBy: long}, codes.InvalidArgument, "acquired_by"},
		{"long acquired_for", pool.AcquireParams{AcquiredFor: long}, codes.InvalidArgument, "acquired_for"},
		{"long pool id", pool.AcquireParams{PoolID: store.PoolID(long)}, codes.InvalidArgument, "pool_id"},
		{"long pool name", pool.AcquireParams{PoolName: long}, codes.InvalidArgument, "pool_name"},
		{"unknown pool id", pool.AcquireParams{PoolID: "nope"}, codes.NotFound, ""},
		{"unknown pool name", pool.AcquireParams{PoolName: "nope"}, codes.NotFound, ""},
		{"empty pool", pool.AcquireParams{PoolName: "eph"}, codes.ResourceExhausted, ""},
		{"draining pool by name", pool.AcquireParams{PoolName: "drained"}, codes.FailedPrecondition, ""},
		{"draining pool by id", pool.AcquireParams{PoolID: drained.ID}, codes.FailedPrecondition, ""},
		{"class mismatch by id", pool.AcquireParams{PoolID: drained.ID, LifecycleClass: store.ClassSpot}, codes.FailedPrecondition, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.svc.Acquire(e.ctx, tc.p)
			wantCode(t, err, tc.code)
			if tc.field != "" && !strings.HasPrefix(errMsg(err), tc.field+":") {
				t.Fatalf("the message does not name %s: %v", tc.field, err)
			}
		})
	}
}

// No ready member: ResourceExhausted, and a replenish of that pool is
// nudged rather than left to the next tick.
func TestNoReadyMemberNudgesAReplenish(t *testing.T) {
	e := newEnv(t, instancestest.SQLite)
	p := e.create("ci", 2, store.PoolMetadata{})
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan struct{})
	go func() { defer close(done); e.svc.RunNudges(ctx) }()
	defer func() { cancel(); <-done }()
	// The replenish's members announce themselves in the event log; each
	// append notifies after its commit.
	evs, stop := e.st.Subscribe(store.ChannelEvents)
	defer stop()
	_, err := e.svc.Acquire(e.ctx, pool.AcquireParams{PoolName: "ci"})
	wantCode(t, err, codes.ResourceExhausted)
	if !strings.Contains(err.Error(), "NoReadyMembers") {
		t.Fatalf("message: %v", err)
	}
	timeout := time.After(10 * time.Second)
	for e.counts(p).Warming != 2 {
		select {
		case <-evs:
		case <-timeout:
			t.Fatalf("no replenish after the refused acquire: %+v", e.counts(p))
		}
	}
}

func TestRelease(t *testing.T) {
	tests := []struct {
		name        string
		reuse       bool
		cordon      bool
		failAlways  bool
		disposition string
		poolState   lifecycle.PoolState
		status      lifecycle.State
	}{
		{"recycled by default", false, false, false, claims.Recycled, lifecycle.PoolDraining, lifecycle.Terminated},
		{"recycled even when cordoned", false, true, false, claims.Recycled, lifecycle.PoolDraining, lifecycle.Terminated},
		{"a failed terminate is errored", false, false, true, claims.Errored, lifecycle.PoolErrored, lifecycle.Running},
		{"reused", true, false, false, claims.Reused, lifecycle.PoolReady, lifecycle.Running},
		{"cordoned", true, true, false, claims.Cordoned, lifecycle.PoolDraining, lifecycle.Running},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, instancestest.SQLite)
			p := e.create("ci", 1, store.PoolMetadata{ReuseWithoutReset: tc.reuse})
			e.warm(p)
			c, err := e.svc.Acquire(e.ctx, pool.AcquireParams{PoolName: "ci", AcquiredBy: "alice", AcquiredFor: "tests"})
			must(t, err)
			if tc.cordon {
				if _, _, err := e.inst.Cordon(e.ctx, c.Instance.ID, "suspect disk", "bob"); err != nil {
					t.Fatal(err)
				}
			}
			if tc.failAlways {
				e.fake.Inject(fake.OpTerminate, fake.Fault{Kind: providers.KindTransient, Message: "hypervisor wedged"})
			}
			e.clk.Advance(90 * time.Second)
			r, err := e.svc.Release(e.ctx, c.Instance.ID, "alice")
			must(t, err)
			in := e.get(c.Instance.ID)
			if r.Disposition != tc.disposition || in.PoolState != tc.poolState || in.Status != tc.status || r.ClaimID != c.ID ||
				r.Held != 90*time.Second {
				t.Fatalf("release: disposition %s state %s status %s claim %s held %s", r.Disposition, in.PoolState, in.Status, r.ClaimID, r.Held)
			}
			if in.ClaimID != "" || in.AcquiredBy != "" {
				t.Fatalf("the claim stayed on the row: %q %q", in.ClaimID, in.AcquiredBy)
			}
			rel := e.events(events.PoolReleased, store.EventFilter{CorrelationID: c.ID.Correlation()})
			if len(rel) != 1 {
				t.Fatalf("%d release events", len(rel))
			}
			pl := payload(t, rel[0])
			if pl["disposition"] != tc.disposition || pl["acquired_by"] != "alice" || pl["acquired_for"] != "tests" ||
				pl["held_seconds"] != float64(90) || pl["claim_id"] != c.ID.String() {
				t.Fatalf("release event: %v", pl)
			}
			switch tc.disposition {
			case claims.Errored:
				if r.Err == nil || !strings.Contains(in.ErrorMessage, "hypervisor wedged") || !strings.Contains(pl["error"].(string), "hypervisor wedged") {
					t.Fatalf("the failure is not reported: %v / %q / %v", r.Err, in.ErrorMessage, pl["error"])
				}
				if len(e.events(events.PoolTerminateFailed, store.EventFilter{InstanceID: in.ID})) != 1 || in.PoolNextTerminateAt == nil {
					t.Fatal("errored member without pool.terminate_failed or a scheduled retry")
				}
				if c := e.counts(p); c.Errored != 1 || c.Claimed != 0 {
					t.Fatalf("counts %+v", c)
				}
			case claims.Reused:
				if in.PoolReadyAt == nil || !in.PoolReadyAt.Equal(e.clk.Now()) {
					t.Fatalf("reuse must reset the TTL anchor: %v", in.PoolReadyAt)
				}
			}
			// Releasing again is refused: the claim is closed.
			_, err = e.svc.Release(e.ctx, c.Instance.ID, "alice")
			wantCode(t, err, codes.FailedPrecondition)
		})
	}
}

func TestReleaseRefusals(t *testing.T) {
	e := newEnv(t, instancestest.SQLite)
	p := e.create("ci", 1, store.PoolMetadata{})
	ready := e.warm(p)[0]
	res, err := e.inst.Provision(e.ctx, instancesParams(e, "loner"))
	must(t, err)
	tests := []struct {
		name string
		id   store.InstanceID
		code codes.Code
	}{
		{"blank id", "", codes.InvalidArgument},
		{"unknown instance", "nope", codes.NotFound},
		{"not a member", res.Instance.ID, codes.FailedPrecondition},
		{"not claimed", ready.ID, codes.FailedPrecondition},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.svc.Release(e.ctx, tc.id, "alice")
			wantCode(t, err, tc.code)
		})
	}
}

// Terminating a claimed member directly closes its claim (terminated), so
// no phantom claimed member stays counted or flagged.
func TestTerminateClaimedMemberClosesTheClaim(t *testing.T) {
	eachBackend(t, func(t *testing.T, open func(testing.TB) store.Store) {
		e := newEnv(t, open)
		p := e.create("ci", 1, store.PoolMetadata{})
		e.warm(p)
		c, err := e.svc.Acquire(e.ctx, pool.AcquireParams{PoolName: "ci", AcquiredBy: "alice"})
		must(t, err)
		e.clk.Advance(time.Minute)
		if _, err := e.inst.Terminate(e.ctx, c.Instance.ID); err != nil {
			t.Fatal(err)
		}
		in := e.get(c.Instance.ID)
		if in.PoolState == lifecycle.PoolClaimed || in.ClaimID != "" || e.counts(p).Claimed != 0 {
			t.Fatalf("phantom claim: state %s claim %q counts %+v", in.PoolState, in.ClaimID, e.counts(p))
		}
		rel := e.events(events.PoolReleased, store.EventFilter{CorrelationID: c.ID.Correlation()})
		if len(rel) != 1 || payload(t, rel[0])["disposition"] != claims.Terminated || payload(t, rel[0])["held_seconds"] != float64(60) {
			t.Fatalf("release record: %v", rel)
		}
	})
}

// Warming → ready on the agent's first phase=ready, in the transaction
// that records it; a member with a cordon marker goes to draining. A
// warming member leases no task.
func TestWarmingToReady(t *testing.T) {
	eachBackend(t, func(t *testing.T, open func(testing.TB) store.Store) {
		e := newEnv(t, open)
		p := e.create("ci", 2, store.PoolMetadata{})
		_, _, err := e.svc.Replenish(e.ctx, "ci")
		must(t, err)
		e.work()
		warming := e.live(p, lifecycle.PoolWarming)
		if len(warming) != 2 {
			t.Fatalf("%d warming", len(warming))
		}
		ts := &tasks.Service{Store: e.st, Clock: e.clk, Log: e.inst.Log}
		_, err = ts.CreateAgentTask(e.ctx, warming[0].ID, "reboot", nil, 0)
		wantCode(t, err, codes.FailedPrecondition)
		// Even a task that reached a warming member some other way is not leased.
		sneaked := &store.Task{Target: store.TaskTargetAgent, InstanceID: warming[0].ID, Kind: "reboot", Payload: []byte("{}"),
			Status: store.TaskPending, MaxAttempts: 1, CreatedAt: t0, UpdatedAt: t0}
		must(t, e.st.CreateTask(e.ctx, sneaked))
		if got, err := ts.LeaseNext(e.ctx, warming[0].ID); err != nil || got != nil {
			t.Fatalf("a warming member leased %v (%v)", got, err)
		}

		e.clk.Advance(45 * time.Second)
		e.ready(warming[0].ID)
		in := e.get(warming[0].ID)
		if in.PoolState != lifecycle.PoolReady || in.Status != lifecycle.Running || in.PoolReadyAt == nil || !in.PoolReadyAt.Equal(e.clk.Now()) {
			t.Fatalf("after ready: %s %s %v", in.PoolState, in.Status, in.PoolReadyAt)
		}
		ev := e.events(events.PoolMemberReady, store.EventFilter{InstanceID: in.ID})
		if len(ev) != 1 || payload(t, ev[0])["warm_seconds"] != float64(45) {
			t.Fatalf("member_ready: %v", ev)
		}
		// Ready now: the task it had is leased.
		if got, err := ts.LeaseNext(e.ctx, in.ID); err != nil || got == nil {
			t.Fatalf("a ready member's task was not leased: %v", err)
		}
		// A second ready report (a reconnect) changes nothing.
		e.ready(in.ID)
		if n := len(e.events(events.PoolMemberReady, store.EventFilter{InstanceID: in.ID})); n != 1 {
			t.Fatalf("%d member_ready events", n)
		}

		// A cordon marker on a warming member (written behind cordon's
		// back: cordon refuses warming members) sends it to draining.
		other := e.get(warming[1].ID)
		other.Cordon = &store.Cordon{By: "bob", Reason: "bad rack", At: t0}
		must(t, e.st.UpdateInstance(e.ctx, other))
		e.ready(other.ID)
		if got := e.get(other.ID).PoolState; got != lifecycle.PoolDraining {
			t.Fatalf("cordoned member is %s", got)
		}
		if payload(t, e.events(events.PoolMemberReady, store.EventFilter{InstanceID: other.ID})[0])["pool_state"] != string(lifecycle.PoolDraining) {
			t.Fatal("member_ready must say where the member went")
		}
	})
}

// Replenishers racing on one pool never overshoot the target.
func TestConcurrentReplenish(t *testing.T) {
	eachBackend(t, func(t *testing.T, open func(testing.TB) store.Store) {
		e := newEnv(t, open)
		p := e.create("ci", 7, store.PoolMetadata{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		total := 0
		for i := 0; i < 4; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, r, err := e.svc.Replenish(e.ctx, p.Name)
				if err != nil {
					t.Error(err)
				}
				mu.Lock()
				total += r.Provisioned
				mu.Unlock()
			}()
		}
		wg.Wait()
		if c := e.counts(p); c.Warming != 7 || total != 7 {
			t.Fatalf("warming %d, provisioned %d; want 7", c.Warming, total)
		}
	})
}

// max_size bounds every live member holding a machine, claimed included.
func TestReplenishRespectsMaxSize(t *testing.T) {
	e := newEnv(t, instancestest.SQLite)
	v, err := e.svc.Create(e.ctx, pool.CreateParams{Name: "ci", Template: "tpl", Provider: fake.Name, TargetSize: 3, MaxSize: intp(4)})
	must(t, err)
	p := v.Pool
	e.warm(p)
	for i := 0; i < 3; i++ {
		if _, err := e.svc.Acquire(e.ctx, pool.AcquireParams{PoolName: "ci"}); err != nil {
			t.Fatal(err)
		}
	}
	// target wants 3 more; max allows 4 − 3 claimed = 1.
	_, r, err := e.svc.Replenish(e.ctx, "ci")
	must(t, err)
	if r.Provisioned != 1 {
		t.Fatalf("provisioned %d, want 1", r.Provisioned)
	}
}

func instancesParams(e *env, node string) instancesProvision {
	e.t.Helper()
	n := &store.Node{Name: node, TemplateID: e.tpl.ID, Enabled: true, Config: []byte("{}"), CreatedAt: t0, UpdatedAt: t0}
	must(e.t, e.st.CreateNode(e.ctx, n))
	return instancesProvision{Node: node, Provider: fake.Name}
}

// A member whose machine the provider has seen exit is never handed out,
// though its row reads running and ready and its agent's presence lease
// still stands (a replica killed while holding the stream, or a stream
// whose end has not reached the store): the claim parks it errored in the
// same transaction and takes the next member, or answers NoReadyMembers.
func TestAcquireSkipsMembersWhoseMachineExited(t *testing.T) {
	for _, tc := range []struct {
		name string
		// kill ends the machines of the members at these positions
		// (oldest first) behind the control plane's back.
		dead    []int
		kill    func(f *fake.Provider, machine string)
		handOut int // position handed out; -1: none
	}{
		{"the oldest stopped: the next is handed out", []int{0}, func(f *fake.Provider, m string) { f.SetState(m, providers.StateStopped) }, 1},
		{"the oldest crashed: the next is handed out", []int{0}, func(f *fake.Provider, m string) { f.Crash(m, "killed by signal 9") }, 1},
		{"the oldest vanished: the next is handed out", []int{0}, func(f *fake.Provider, m string) { f.Vanish(m) }, 1},
		{"every member stopped: none", []int{0, 1}, func(f *fake.Provider, m string) { f.SetState(m, providers.StateStopped) }, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, open func(testing.TB) store.Store) {
				e := newEnv(t, open)
				p := e.create("warm", 2, store.PoolMetadata{})
				members := e.warm(p)
				if len(members) != 2 {
					t.Fatalf("%d ready members, want 2", len(members))
				}
				sortByWarming(members)
				for _, i := range tc.dead {
					tc.kill(e.fake, members[i].CloudInstanceID)
				}

				c, err := e.svc.Acquire(e.ctx, pool.AcquireParams{PoolName: "warm", AcquiredBy: "ci"})
				if tc.handOut < 0 {
					wantCode(t, err, codes.ResourceExhausted)
				} else {
					must(t, err)
					if c.Instance.ID != members[tc.handOut].ID {
						t.Fatalf("handed out %s, want %s", c.Instance.ID, members[tc.handOut].ID)
					}
				}
				for _, i := range tc.dead {
					in := e.get(members[i].ID)
					if in.Status != lifecycle.Error || in.PoolState != lifecycle.PoolErrored || in.ClaimID != "" ||
						!strings.Contains(in.ErrorMessage, "machine exited outside Tether") {
						t.Fatalf("dead member %d: status %s pool state %s claim %q reason %q", i, in.Status, in.PoolState, in.ClaimID, in.ErrorMessage)
					}
					evs := e.events(events.InstanceErrored, store.EventFilter{InstanceID: in.ID})
					if len(evs) != 1 || payload(t, evs[0])["source"] != "claim" {
						t.Fatalf("dead member %d: errored events %v", i, evs)
					}
					if n := len(e.events(events.PoolClaimed, store.EventFilter{InstanceID: in.ID})); n != 0 {
						t.Fatalf("dead member %d has %d pool.claimed events", i, n)
					}
				}
				// The parked members are out of ready for good: another
				// acquire does not meet them again.
				if c := e.counts(p); c.Ready != 0 {
					t.Fatalf("after the claim: %+v", c)
				}
			})
		})
	}
}

// sortByWarming orders members oldest first, as a claim takes them.
func sortByWarming(ms []*store.Instance) {
	sort.Slice(ms, func(i, j int) bool { return ms[i].PoolWarmingStartedAt.Before(*ms[j].PoolWarmingStartedAt) })
}
