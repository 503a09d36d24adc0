package pool

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/providers"
)

// ReplenishResult counts what a replenish did. Err explains Failed (and a
// stop short of the deficit).
type ReplenishResult struct {
	Provisioned, Failed int
	Err                 error
}

// errNotActive stops a replenish of a pool that is not (or no longer)
// active. Lesson (docs/design.md §4.7): a drained pool was silently re-provisioned by
// the next tick because only "paused" was checked.
var errNotActive = errors.New("pool is not active")

// Replenish provisions members up to the pool's target now. It refuses a
// pool that is not active.
func (s *Service) Replenish(ctx context.Context, name string) (*View, ReplenishResult, error) {
	p, err := s.byName(ctx, name)
	if err != nil {
		return nil, ReplenishResult{}, err
	}
	if p.Status != store.PoolActive {
		return nil, ReplenishResult{}, notActive(p)
	}
	r := s.replenish(ctx, p.ID)
	if errors.Is(r.Err, errNotActive) {
		// Paused or drained while we were at it.
		if p, err = s.Store.GetPoolByID(ctx, p.ID); err == nil {
			return nil, r, notActive(p)
		}
	}
	if r.Err != nil {
		s.Log.Warn("pool replenish failed", "pool", p.Name, "provisioned", r.Provisioned, "failed", r.Failed, "err", r.Err)
		if r.Provisioned == 0 {
			return nil, r, r.Err
		}
	}
	v, err := s.view(ctx, s.Store, p, false)
	return v, r, err
}

func notActive(p *store.Pool) error {
	return fail.Precondition("pool %q is %s; replenish is allowed only for an active pool (activate it first)", p.Name, p.Status)
}

// replenish adds members one transaction at a time. Each transaction
// locks the pool row, recounts its members and adds one only if the pool
// is still active and still short, so replenishers racing on two replicas,
// or a tick retried after a lost commit, never overshoot: what a retry
// would add again is already counted. Each member gets its own node, named
// after the pool, and an operation id naming that node, so a replay of one
// member's provision finds the instance it made.
func (s *Service) replenish(ctx context.Context, poolID store.PoolID) ReplenishResult {
	var r ReplenishResult
	for i := 0; i <= MaxPoolSize; i++ {
		want := 0
		err := s.Store.Tx(ctx, func(q store.Queries) error {
			p, err := q.LockPool(ctx, poolID)
			if err != nil {
				return err
			}
			if p.Status != store.PoolActive {
				return fmt.Errorf("pool %s is %s: %w", p.Name, p.Status, errNotActive)
			}
			c, err := q.CountPoolMembers(ctx, p.ID)
			if err != nil {
				return err
			}
			if want = need(p, c); want == 0 {
				return nil
			}
			now := s.Clock.Now()
			node, err := s.memberNode(ctx, q, p, now)
			if err != nil {
				return err
			}
			if _, err := s.Instances.ProvisionTx(ctx, q, instances.ProvisionParams{Node: node.Name, Provider: p.Provider,
				Region: p.Region, InstanceType: p.InstanceType, OperationID: "pool/" + p.ID.String() + "/" + node.Name, PoolID: p.ID}); err != nil {
				return fmt.Errorf("provision member of pool %s: %w", p.Name, err)
			}
			p.LastReplenishedAt = &now
			return q.UpdatePool(ctx, p)
		})
		switch {
		case errors.Is(err, errNotActive):
			r.Err = err
			return r
		case err != nil:
			// A failure here (no kernel in the template, the provider
			// gone) would fail the rest of the deficit the same way.
			r.Failed, r.Err = want, err
			return r
		case want == 0:
			return r
		}
		r.Provisioned++
	}
	return r
}

// memberNode is the node of a new member. A provider whose machine is
// its node's own (providers.NodeHardware; redfish: the node's server,
// behind its BMC) takes a free node of the pool's template with a BMC,
// one with no live instance; every other provider gets a new node named
// after the pool.
func (s *Service) memberNode(ctx context.Context, q store.Queries, p *store.Pool, now time.Time) (*store.Node, error) {
	prov, err := s.Instances.Provider(p.Provider)
	if err != nil {
		return nil, err
	}
	if !providers.MachinesAreNodes(prov) {
		name, err := memberNodeName(p.Name)
		if err != nil {
			return nil, err
		}
		node := &store.Node{Name: name, TemplateID: p.TemplateID, Enabled: true, Config: []byte("{}"), CreatedAt: now, UpdatedAt: now}
		if err := q.CreateNode(ctx, node); err != nil {
			return nil, fmt.Errorf("member node %s: %w", name, err)
		}
		return node, nil
	}
	page := store.Page{Limit: store.MaxPageSize}
	for {
		ns, err := q.ListNodes(ctx, store.NodeFilter{TemplateID: p.TemplateID, HasBMC: true}, page)
		if err != nil {
			return nil, err
		}
		for _, n := range ns {
			if !n.Enabled {
				continue
			}
			live, err := q.CountInstances(ctx, store.InstanceFilter{NodeID: n.ID, Statuses: liveStates})
			if err != nil {
				return nil, err
			}
			if live == 0 {
				return n, nil
			}
		}
		if len(ns) < page.Limit {
			return nil, fail.Exhausted("pool %s: no free machine: every enabled node of its template with a BMC has a live instance (add one with `tetherctl node create NAME --template T --mac MAC --bmc redfish://... --bmc-credentials C`)", p.Name)
		}
		page.After = ns[len(ns)-1].Name
	}
}

// liveStates are every state but terminated.
var liveStates = slices.DeleteFunc(lifecycle.States(), func(st lifecycle.State) bool { return st.Terminal() })

// memberNodeName names a member's node after its pool.
func memberNodeName(pool string) (string, error) {
	b := make([]byte, 5)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("member node name: %w", err)
	}
	return pool + "-" + hex.EncodeToString(b), nil
}
