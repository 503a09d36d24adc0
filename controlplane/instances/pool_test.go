package instances_test

import (
	"encoding/json"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/pool/claims"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/providers/external"
	"github.com/tetherfleet/tether/providers/fake"
)

// A member is created warming, its warm-up clock started, in the insert
// that creates it.
func TestProvisionPoolMember(t *testing.T) {
	e := newEnv(t)
	pl := &store.Pool{Name: "p1", TemplateID: e.node.TemplateID, Provider: fake.Name, LifecycleClass: store.ClassEphemeral,
		TargetSize: 1, MaxSize: 11, Status: store.PoolActive, CreatedAt: t0, UpdatedAt: t0}
	if err := e.st.CreatePool(e.ctx, pl); err != nil {
		t.Fatal(err)
	}
	res, err := e.svc.Provision(e.ctx, instances.ProvisionParams{Node: e.node.Name, Provider: fake.Name, PoolID: pl.ID, OperationID: "pool/x"})
	if err != nil {
		t.Fatal(err)
	}
	in := e.get(res.Instance.ID)
	if in.PoolID != pl.ID || in.PoolState != lifecycle.PoolWarming || in.PoolWarmingStartedAt == nil || !in.PoolWarmingStartedAt.Equal(t0) {
		t.Fatalf("member: pool %q state %q warming %v", in.PoolID, in.PoolState, in.PoolWarmingStartedAt)
	}
	evs, _ := e.st.ListEvents(e.ctx, store.EventFilter{Kind: events.InstanceProvisioned, PoolID: pl.ID}, store.Page{})
	if len(evs) != 1 {
		t.Fatalf("%d provisioned events for the pool", len(evs))
	}
	// A retry inside another transaction returns the member, not a second one.
	var again *instances.Provisioned
	if err := e.st.Tx(e.ctx, func(q store.Queries) error {
		var err error
		again, err = e.svc.ProvisionTx(e.ctx, q, instances.ProvisionParams{Node: e.node.Name, Provider: fake.Name, PoolID: pl.ID, OperationID: "pool/x"})
		return err
	}); err != nil || !again.Existed || again.Instance.ID != in.ID {
		t.Fatalf("retry: %v %v", again, err)
	}
	_, err = e.svc.Provision(e.ctx, instances.ProvisionParams{Node: e.node.Name, Provider: external.Name, PoolID: pl.ID})
	wantCode(t, err, codes.InvalidArgument)
}

// A terminate closes an open claim in the transaction that marks the
// member terminated: terminated for a claimed member, recycled for one
// whose release had begun.
func TestTerminateClosesOpenClaims(t *testing.T) {
	for _, tc := range []struct {
		state       lifecycle.PoolState
		disposition string
	}{{lifecycle.PoolClaimed, claims.Terminated}, {lifecycle.PoolDraining, claims.Recycled}} {
		t.Run(string(tc.state), func(t *testing.T) {
			e := newEnv(t)
			in := e.pooled(tc.state)
			in.ClaimID, in.AcquiredBy, in.AcquiredFor = "claim-1", "alice", "ci"
			acquired := t0
			in.PoolAcquiredAt = &acquired
			if err := e.st.UpdateInstance(e.ctx, in); err != nil {
				t.Fatal(err)
			}
			e.clk.Advance(42e9)
			if _, err := e.svc.Terminate(e.ctx, in.ID); err != nil {
				t.Fatal(err)
			}
			got := e.get(in.ID)
			if got.PoolState != lifecycle.PoolDraining || got.ClaimID != "" || got.AcquiredBy != "" {
				t.Fatalf("after terminate: state %s claim %q", got.PoolState, got.ClaimID)
			}
			evs, _ := e.st.ListEvents(e.ctx, store.EventFilter{Kind: events.PoolReleased, CorrelationID: "claim-1"}, store.Page{})
			if len(evs) != 1 {
				t.Fatalf("%d release events", len(evs))
			}
			var p map[string]any
			_ = json.Unmarshal(evs[0].Payload, &p)
			if p["disposition"] != tc.disposition || p["acquired_by"] != "alice" || p["held_seconds"] != float64(42) || p["pool_name"] != "p1" {
				t.Fatalf("release payload %v", p)
			}
		})
	}
}
