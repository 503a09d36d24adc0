package api

import (
	"context"
	"time"

	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/pool"
	"github.com/tetherfleet/tether/controlplane/store"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// The pool RPCs (docs/design.md §4). The logic lives in controlplane/pool; these
// handlers translate the request, name the caller and convert the answer.

func (a *adminServer) pools() (*pool.Service, error) {
	if a.Pools == nil {
		return nil, fail.Unavailable("pools are not wired into this control plane")
	}
	return a.Pools, nil
}

// LifecycleClassName is the stored form of a lifecycle class ("" for
// unspecified).
func LifecycleClassName(c v1.LifecycleClass) string { return storedName("LIFECYCLE_CLASS_", c) }

func lifecycleClass(name string) v1.LifecycleClass {
	return fromStored[v1.LifecycleClass]("LIFECYCLE_CLASS_", name, v1.LifecycleClass_value)
}

func poolStatus(name string) v1.PoolStatus {
	return fromStored[v1.PoolStatus]("POOL_STATUS_", name, v1.PoolStatus_value)
}

func metadataIn(m *v1.PoolMetadata) store.PoolMetadata {
	if m == nil {
		return store.PoolMetadata{}
	}
	out := store.PoolMetadata{WarmingTimeoutSeconds: int(m.WarmingTimeoutSeconds), ReadyTTLSeconds: int(m.ReadyTtlSeconds),
		ClaimedTTLSeconds: int(m.ClaimedTtlSeconds), ReuseWithoutReset: m.ReuseWithoutReset,
		ErroredTerminateMaxAttempts: int(m.ErroredTerminateMaxAttempts)}
	if m.RecordRetentionDays != nil {
		d := int(*m.RecordRetentionDays)
		out.RecordRetentionDays = &d
	}
	return out
}

// PoolProto converts a pool view; its metadata is shown with the
// defaults written out, so operators read the values in force.
func PoolProto(v *pool.View) *v1.Pool {
	p := v.Pool
	m := pool.Effective(p)
	days := int32(*m.RecordRetentionDays)
	out := &v1.Pool{
		Id: p.ID, Name: p.Name, TemplateId: p.TemplateID.String(), TemplateName: v.TemplateName, Provider: p.Provider, Region: p.Region,
		InstanceType: p.InstanceType, LifecycleClass: lifecycleClass(p.LifecycleClass), TargetSize: int32(p.TargetSize),
		MinSize: int32(p.MinSize), MaxSize: int32(p.MaxSize), Status: poolStatus(p.Status),
		Metadata: &v1.PoolMetadata{WarmingTimeoutSeconds: int32(m.WarmingTimeoutSeconds), ReadyTtlSeconds: int32(m.ReadyTTLSeconds),
			ClaimedTtlSeconds: int32(m.ClaimedTTLSeconds), RecordRetentionDays: &days, ReuseWithoutReset: m.ReuseWithoutReset,
			ErroredTerminateMaxAttempts: int32(m.ErroredTerminateMaxAttempts)},
		Counts: &v1.PoolCounts{Ready: int32(v.Counts.Ready), Warming: int32(v.Counts.Warming), Claimed: int32(v.Counts.Claimed),
			Draining: int32(v.Counts.Draining), Errored: int32(v.Counts.Errored), Deficit: int32(v.Deficit)},
		LastReplenishedAt: ntsp(p.LastReplenishedAt), CreatedAt: tsp(p.CreatedAt), UpdatedAt: tsp(p.UpdatedAt),
	}
	for _, mb := range v.Members {
		in := mb.Instance
		out.Members = append(out.Members, &v1.PoolMember{InstanceId: in.ID, NodeName: mb.NodeName, PoolState: poolState(in.PoolState),
			Status: instanceStatus(in.Status), PoolWarmingStartedAt: ntsp(in.PoolWarmingStartedAt), PoolAcquiredAt: ntsp(in.PoolAcquiredAt)})
	}
	return out
}

func poolReply(v *pool.View, err error) (*v1.Pool, error) {
	if err != nil {
		return nil, err
	}
	return PoolProto(v), nil
}

func (a *adminServer) CreatePool(ctx context.Context, req *v1.CreatePoolRequest) (*v1.Pool, error) {
	ps, err := a.pools()
	if err != nil {
		return nil, err
	}
	p := pool.CreateParams{Name: req.Name, Template: req.Template, Provider: req.Provider, Region: req.Region,
		InstanceType: req.InstanceType, LifecycleClass: LifecycleClassName(req.LifecycleClass),
		TargetSize: int(req.TargetSize), MinSize: int(req.MinSize), Metadata: metadataIn(req.Metadata)}
	if req.MaxSize != nil {
		m := int(*req.MaxSize)
		p.MaxSize = &m
	}
	return poolReply(ps.Create(ctx, p))
}

func (a *adminServer) GetPool(ctx context.Context, req *v1.GetPoolRequest) (*v1.Pool, error) {
	ps, err := a.pools()
	if err != nil {
		return nil, err
	}
	return poolReply(ps.Get(ctx, req.Name))
}

func (a *adminServer) ListPools(ctx context.Context, req *v1.ListPoolsRequest) (*v1.ListPoolsResponse, error) {
	ps, err := a.pools()
	if err != nil {
		return nil, err
	}
	pg, err := page(req.PageSize, req.PageToken)
	if err != nil {
		return nil, err
	}
	vs, err := ps.List(ctx, pg)
	if err != nil {
		return nil, err
	}
	out := &v1.ListPoolsResponse{}
	var b budget
	for _, v := range vs {
		pp := PoolProto(v)
		if !b.fits(pp) {
			break
		}
		out.Pools = append(out.Pools, pp)
	}
	if b.more(len(out.Pools), len(vs), pg.Limit) {
		out.NextPageToken = vs[len(out.Pools)-1].Pool.Name
	}
	return out, nil
}

// poolUpdateFields are what an update mask may name.
var poolUpdateFields = func() []string {
	out := []string{pool.FieldTargetSize, pool.FieldMinSize, pool.FieldMaxSize, pool.FieldLifecycleClass, pool.FieldMetadata}
	for _, f := range pool.MetadataFields {
		out = append(out, pool.FieldMetadata+"."+f)
	}
	return out
}()

func (a *adminServer) UpdatePool(ctx context.Context, req *v1.UpdatePoolRequest) (*v1.Pool, error) {
	ps, err := a.pools()
	if err != nil {
		return nil, err
	}
	if req.Name == "" {
		return nil, fail.Invalid("name", "required")
	}
	mask, err := updateMask(req.UpdateMask, poolUpdateFields...)
	if err != nil {
		return nil, err
	}
	return poolReply(ps.Update(ctx, pool.UpdateParams{Name: req.Name, Mask: mask, TargetSize: int(req.TargetSize),
		MinSize: int(req.MinSize), MaxSize: int(req.MaxSize), LifecycleClass: LifecycleClassName(req.LifecycleClass),
		Metadata: metadataIn(req.Metadata)}))
}

func (a *adminServer) PausePool(ctx context.Context, req *v1.PoolActionRequest) (*v1.Pool, error) {
	ps, err := a.pools()
	if err != nil {
		return nil, err
	}
	return poolReply(ps.Pause(ctx, req.Name))
}

func (a *adminServer) ActivatePool(ctx context.Context, req *v1.PoolActionRequest) (*v1.Pool, error) {
	ps, err := a.pools()
	if err != nil {
		return nil, err
	}
	return poolReply(ps.Activate(ctx, req.Name))
}

func (a *adminServer) DrainPool(ctx context.Context, req *v1.PoolActionRequest) (*v1.DrainPoolResponse, error) {
	ps, err := a.pools()
	if err != nil {
		return nil, err
	}
	r, err := ps.Drain(ctx, req.Name)
	if err != nil {
		return nil, err
	}
	return &v1.DrainPoolResponse{Pool: PoolProto(r.View), Drained: int32(r.Drained), TerminateFailed: int32(r.TerminateFailed),
		ClaimedRemaining: int32(r.ClaimedRemaining), FailedInstanceIds: r.FailedIDs}, nil
}

func (a *adminServer) DeletePool(ctx context.Context, req *v1.PoolActionRequest) (*v1.DeletePoolResponse, error) {
	ps, err := a.pools()
	if err != nil {
		return nil, err
	}
	if err := ps.Delete(ctx, req.Name); err != nil {
		return nil, err
	}
	return &v1.DeletePoolResponse{}, nil
}

func (a *adminServer) ReplenishPool(ctx context.Context, req *v1.PoolActionRequest) (*v1.ReplenishPoolResponse, error) {
	ps, err := a.pools()
	if err != nil {
		return nil, err
	}
	v, r, err := ps.Replenish(ctx, req.Name)
	if err != nil {
		return nil, err
	}
	return &v1.ReplenishPoolResponse{Pool: PoolProto(v), Provisioned: int32(r.Provisioned), ProvisionFailed: int32(r.Failed)}, nil
}

func (a *adminServer) RecyclePool(ctx context.Context, req *v1.PoolActionRequest) (*v1.RecyclePoolResponse, error) {
	ps, err := a.pools()
	if err != nil {
		return nil, err
	}
	v, r, err := ps.Recycle(ctx, req.Name)
	if err != nil {
		return nil, err
	}
	return &v1.RecyclePoolResponse{Pool: PoolProto(v), Recycled: int32(r.Recycled), Replaced: int32(r.Replaced),
		Flagged: int32(r.Flagged), Retried: int32(r.Retried), Abandoned: int32(r.Abandoned), Pruned: int32(r.Pruned),
		TerminateFailed: int32(r.TerminateFailed)}, nil
}

func (a *adminServer) AcquirePoolMember(ctx context.Context, req *v1.AcquirePoolMemberRequest) (*v1.AcquirePoolMemberResponse, error) {
	ps, err := a.pools()
	if err != nil {
		return nil, err
	}
	c, err := ps.Acquire(ctx, pool.AcquireParams{PoolID: req.PoolId, PoolName: req.PoolName,
		LifecycleClass: LifecycleClassName(req.LifecycleClass), AcquiredBy: req.AcquiredBy, AcquiredFor: req.AcquiredFor})
	if err != nil {
		return nil, err
	}
	return &v1.AcquirePoolMemberResponse{ClaimId: c.ID, Instance: InstanceProto(c.Instance, c.NodeName),
		PoolId: c.Pool.ID, PoolName: c.Pool.Name}, nil
}

func (a *adminServer) ReleasePoolMember(ctx context.Context, req *v1.ReleasePoolMemberRequest) (*v1.ReleasePoolMemberResponse, error) {
	ps, err := a.pools()
	if err != nil {
		return nil, err
	}
	r, err := ps.Release(ctx, req.InstanceId, a.callerName(ctx))
	if err != nil {
		return nil, err
	}
	// An errored disposition is an answer, not a failure of the call: the
	// claim is closed. The terminate's error is on the instance
	// (error_message) and in the pool.released and pool.terminate_failed
	// events.
	return &v1.ReleasePoolMemberResponse{Disposition: r.Disposition, Instance: InstanceProto(r.Instance, r.NodeName),
		ClaimId: r.ClaimID, HeldSeconds: int64(r.Held / time.Second)}, nil
}
