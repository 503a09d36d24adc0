// Package pools serves the pool RPCs of AdminService (docs/design.md §4).
// The logic lives in controlplane/pool; these handlers translate the
// request, name the caller and convert the answer.
package pools

import (
	"context"
	"time"

	"github.com/tetherfleet/tether/controlplane/api/admin/adminkit"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/pool"
	"github.com/tetherfleet/tether/controlplane/store"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// Config is what the pool RPCs use.
type Config struct {
	// Pools serves the pool RPCs (nil: they answer Unavailable, for a
	// control plane built without pools).
	Pools *pool.Service
}

// Server serves the pool RPCs of AdminService.
type Server struct {
	cfg Config
}

// New builds the pool RPCs. Every dependency is optional: without Pools
// each RPC says pools are not wired.
func New(cfg Config) (*Server, error) { return &Server{cfg: cfg}, nil }

func (a *Server) pools() (*pool.Service, error) {
	if a.cfg.Pools == nil {
		return nil, fail.Unavailable("pools are not wired into this control plane")
	}
	return a.cfg.Pools, nil
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
		Id: p.ID.String(), Name: p.Name, TemplateId: p.TemplateID.String(), TemplateName: v.TemplateName, Provider: p.Provider, Region: p.Region,
		InstanceType: p.InstanceType, LifecycleClass: adminkit.LifecycleClass(p.LifecycleClass), TargetSize: int32(p.TargetSize),
		MinSize: int32(p.MinSize), MaxSize: int32(p.MaxSize), Status: adminkit.PoolStatus(p.Status),
		Metadata: &v1.PoolMetadata{WarmingTimeoutSeconds: int32(m.WarmingTimeoutSeconds), ReadyTtlSeconds: int32(m.ReadyTTLSeconds),
			ClaimedTtlSeconds: int32(m.ClaimedTTLSeconds), RecordRetentionDays: &days, ReuseWithoutReset: m.ReuseWithoutReset,
			ErroredTerminateMaxAttempts: int32(m.ErroredTerminateMaxAttempts)},
		Counts: &v1.PoolCounts{Ready: int32(v.Counts.Ready), Warming: int32(v.Counts.Warming), Claimed: int32(v.Counts.Claimed),
			Draining: int32(v.Counts.Draining), Errored: int32(v.Counts.Errored), Deficit: int32(v.Deficit)},
		LastReplenishedAt: adminkit.TimestampPtr(p.LastReplenishedAt), CreatedAt: adminkit.Timestamp(p.CreatedAt), UpdatedAt: adminkit.Timestamp(p.UpdatedAt),
	}
	for _, mb := range v.Members {
		in := mb.Instance
		out.Members = append(out.Members, &v1.PoolMember{InstanceId: in.ID.String(), NodeName: mb.NodeName, PoolState: adminkit.PoolState(in.PoolState),
			Status: adminkit.InstanceStatus(in.Status), PoolWarmingStartedAt: adminkit.TimestampPtr(in.PoolWarmingStartedAt), PoolAcquiredAt: adminkit.TimestampPtr(in.PoolAcquiredAt)})
	}
	return out
}

func poolReply(v *pool.View, err error) (*v1.Pool, error) {
	if err != nil {
		return nil, err
	}
	return PoolProto(v), nil
}

func (a *Server) CreatePool(ctx context.Context, req *v1.CreatePoolRequest) (*v1.Pool, error) {
	ps, err := a.pools()
	if err != nil {
		return nil, err
	}
	p := pool.CreateParams{Name: req.Name, Template: req.Template, Provider: req.Provider, Region: req.Region,
		InstanceType: req.InstanceType, LifecycleClass: adminkit.LifecycleClassName(req.LifecycleClass),
		TargetSize: int(req.TargetSize), MinSize: int(req.MinSize), Metadata: metadataIn(req.Metadata)}
	if req.MaxSize != nil {
		m := int(*req.MaxSize)
		p.MaxSize = &m
	}
	return poolReply(ps.Create(ctx, p))
}

func (a *Server) GetPool(ctx context.Context, req *v1.GetPoolRequest) (*v1.Pool, error) {
	ps, err := a.pools()
	if err != nil {
		return nil, err
	}
	return poolReply(ps.Get(ctx, req.Name))
}

func (a *Server) ListPools(ctx context.Context, req *v1.ListPoolsRequest) (*v1.ListPoolsResponse, error) {
	ps, err := a.pools()
	if err != nil {
		return nil, err
	}
	pg, err := adminkit.Page(req.PageSize, req.PageToken)
	if err != nil {
		return nil, err
	}
	vs, err := ps.List(ctx, pg)
	if err != nil {
		return nil, err
	}
	out := &v1.ListPoolsResponse{}
	if out.Pools, out.NextPageToken, err = adminkit.Fill(vs, pg.Limit,
		func(v *pool.View) (*v1.Pool, error) { return PoolProto(v), nil },
		func(v *pool.View) string { return v.Pool.Name }); err != nil {
		return nil, err
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

func (a *Server) UpdatePool(ctx context.Context, req *v1.UpdatePoolRequest) (*v1.Pool, error) {
	ps, err := a.pools()
	if err != nil {
		return nil, err
	}
	if req.Name == "" {
		return nil, fail.Invalid("name", "required")
	}
	mask, err := adminkit.UpdateMask(req.UpdateMask, poolUpdateFields...)
	if err != nil {
		return nil, err
	}
	return poolReply(ps.Update(ctx, pool.UpdateParams{Name: req.Name, Mask: mask, TargetSize: int(req.TargetSize),
		MinSize: int(req.MinSize), MaxSize: int(req.MaxSize), LifecycleClass: adminkit.LifecycleClassName(req.LifecycleClass),
		Metadata: metadataIn(req.Metadata)}))
}

func (a *Server) PausePool(ctx context.Context, req *v1.PoolActionRequest) (*v1.Pool, error) {
	ps, err := a.pools()
	if err != nil {
		return nil, err
	}
	return poolReply(ps.Pause(ctx, req.Name))
}

func (a *Server) ActivatePool(ctx context.Context, req *v1.PoolActionRequest) (*v1.Pool, error) {
	ps, err := a.pools()
	if err != nil {
		return nil, err
	}
	return poolReply(ps.Activate(ctx, req.Name))
}

func (a *Server) DrainPool(ctx context.Context, req *v1.PoolActionRequest) (*v1.DrainPoolResponse, error) {
	ps, err := a.pools()
	if err != nil {
		return nil, err
	}
	r, err := ps.Drain(ctx, req.Name)
	if err != nil {
		return nil, err
	}
	return &v1.DrainPoolResponse{Pool: PoolProto(r.View), Drained: int32(r.Drained), TerminateFailed: int32(r.TerminateFailed),
		ClaimedRemaining: int32(r.ClaimedRemaining), FailedInstanceIds: adminkit.IDStrings(r.FailedIDs)}, nil
}

func (a *Server) DeletePool(ctx context.Context, req *v1.PoolActionRequest) (*v1.DeletePoolResponse, error) {
	ps, err := a.pools()
	if err != nil {
		return nil, err
	}
	if err := ps.Delete(ctx, req.Name); err != nil {
		return nil, err
	}
	return &v1.DeletePoolResponse{}, nil
}

func (a *Server) ReplenishPool(ctx context.Context, req *v1.PoolActionRequest) (*v1.ReplenishPoolResponse, error) {
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

func (a *Server) RecyclePool(ctx context.Context, req *v1.PoolActionRequest) (*v1.RecyclePoolResponse, error) {
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

func (a *Server) AcquirePoolMember(ctx context.Context, req *v1.AcquirePoolMemberRequest) (*v1.AcquirePoolMemberResponse, error) {
	ps, err := a.pools()
	if err != nil {
		return nil, err
	}
	c, err := ps.Acquire(ctx, pool.AcquireParams{PoolID: store.PoolID(req.PoolId), PoolName: req.PoolName,
		LifecycleClass: adminkit.LifecycleClassName(req.LifecycleClass), AcquiredBy: req.AcquiredBy, AcquiredFor: req.AcquiredFor})
	if err != nil {
		return nil, err
	}
	return &v1.AcquirePoolMemberResponse{ClaimId: c.ID.String(), Instance: adminkit.InstanceProto(c.Instance, c.NodeName),
		PoolId: c.Pool.ID.String(), PoolName: c.Pool.Name}, nil
}

func (a *Server) ReleasePoolMember(ctx context.Context, req *v1.ReleasePoolMemberRequest) (*v1.ReleasePoolMemberResponse, error) {
	ps, err := a.pools()
	if err != nil {
		return nil, err
	}
	r, err := ps.Release(ctx, store.InstanceID(req.InstanceId), adminkit.CallerName(ctx))
	if err != nil {
		return nil, err
	}
	// An errored disposition is an answer, not a failure of the call: the
	// claim is closed. The terminate's error is on the instance
	// (error_message) and in the pool.released and pool.terminate_failed
	// events.
	return &v1.ReleasePoolMemberResponse{Disposition: r.Disposition, Instance: adminkit.InstanceProto(r.Instance, r.NodeName),
		ClaimId: r.ClaimID.String(), HeldSeconds: int64(r.Held / time.Second)}, nil
}
