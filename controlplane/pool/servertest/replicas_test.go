package servertest

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/postgres"
	"github.com/tetherfleet/tether/internal/testkit/pgtest"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// pg is the server this test binary's tests share (fsync off); each test
// gets its own database.
var pg pgtest.Shared

func TestMain(m *testing.M) {
	code := m.Run()
	pg.Close()
	pgDurable.Close()
	os.Exit(code)
}

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// seedReady writes n ready members of a pool straight into the database.
func seedReady(t *testing.T, ctx context.Context, st store.Store, p *v1.Pool, n int) {
	t.Helper()
	err := st.Tx(ctx, func(q store.Queries) error {
		for i := 0; i < n; i++ {
			node := &store.Node{Name: fmt.Sprintf("%s-seed-%03d", p.Name, i), TemplateID: store.TemplateID(p.TemplateId), Enabled: true,
				Config: []byte("{}"), CreatedAt: t0, UpdatedAt: t0}
			if err := q.CreateNode(ctx, node); err != nil {
				return err
			}
			w := t0.Add(time.Duration(i) * time.Millisecond)
			in := &store.Instance{NodeID: node.ID, Status: lifecycle.Running, Provider: "fake",
				CloudInstanceID: node.Name, CreatedAt: w, UpdatedAt: w, PoolMember: store.PoolMember{PoolID: store.PoolID(p.Id), PoolState: lifecycle.PoolReady, PoolWarmingStartedAt: &w, PoolReadyAt: &w}, AgentReport: store.AgentReport{LastHeartbeatAt: &w, Addresses: []string{"10.9.0.1"}}}
			if err := q.CreateInstance(ctx, in); err != nil {
				return err
			}
			// Its agent counts as connected for the whole run.
			if err := q.OpenPresence(ctx, &store.Presence{InstanceID: in.ID, Replica: "seed", StreamID: "s-" + in.ID.String(), ConnectedAt: w,
				LeaseUntil: w.Add(100 * 365 * 24 * time.Hour)}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Two tetherd replicas on one database, 32 claimers spread over both,
// 20 ready members: exactly 20 distinct claims and 12 NoReadyMembers,
// round after round.
func TestAcquireRaceAcrossReplicas(t *testing.T) {
	dsn := pg.DSN(t)
	a := testcp.Start(t, testcp.WithStore(dsn))
	b := testcp.Start(t, testcp.WithStore(dsn), testcp.WithDataDir(a.DataDir))
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	st, err := postgres.Open(ctx, dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	fleet := a.SeedFleet(ctx, "race")
	replicas := []*testcp.ControlPlane{a, b}
	for round := 0; round < 5; round++ {
		// A target of 0: no replenish adds members behind the race's back.
		// The provider only has to be one a pool accepts (qemu is built in).
		p, err := b.Admin.CreatePool(ctx, &v1.CreatePoolRequest{Name: fmt.Sprintf("race-%d", round), Template: fleet.Template, Provider: "qemu"})
		if err != nil {
			t.Fatal(err)
		}
		seedReady(t, ctx, st, p, 20)
		var mu sync.Mutex
		claimed := map[string]string{}
		perReplica := [2]int{}
		exhausted := 0
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := 0; i < 32; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				<-start
				r, err := replicas[i%2].Admin.AcquirePoolMember(ctx, &v1.AcquirePoolMemberRequest{PoolName: p.Name, AcquiredBy: fmt.Sprintf("claimer-%d", i)})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					if prev, dup := claimed[r.Instance.Id]; dup {
						t.Errorf("member %s claimed twice (claims %s and %s)", r.Instance.Id, prev, r.ClaimId)
					}
					claimed[r.Instance.Id] = r.ClaimId
					perReplica[i%2]++
				case status.Code(err) == codes.ResourceExhausted:
					exhausted++
				default:
					t.Errorf("acquire on replica %d: %v", i%2, err)
				}
			}(i)
		}
		close(start)
		wg.Wait()
		if len(claimed) != 20 || exhausted != 12 || perReplica[0] == 0 || perReplica[1] == 0 {
			t.Fatalf("round %d: %d claims (%v per replica), %d exhausted; want 20 and 12", round, len(claimed), perReplica, exhausted)
		}
		evs, err := st.ListEvents(ctx, store.EventFilter{Kind: "pool.claimed", PoolID: store.PoolID(p.Id)}, store.Page{Limit: 100})
		if err != nil || len(evs) != 20 {
			t.Fatalf("round %d: %d claim events (%v)", round, len(evs), err)
		}
	}
}
