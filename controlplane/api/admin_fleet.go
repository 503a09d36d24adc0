package api

import (
	"context"
	"errors"
	"fmt"
	"github.com/tetherfleet/tether/controlplane/api/admin/adminkit"
	"github.com/tetherfleet/tether/providers"
	"time"

	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// Instances, tokens, certificates, tasks and events.

func (a *adminServer) instanceOut(ctx context.Context, in *store.Instance) (*v1.Instance, error) {
	return adminkit.InstanceOut(ctx, a.Store, a.Clock.Now(), in)
}

func (a *adminServer) ProvisionInstance(ctx context.Context, req *v1.ProvisionInstanceRequest) (*v1.ProvisionInstanceResponse, error) {
	res, err := a.Instances.Provision(ctx, instances.ProvisionParams{Node: req.Node, Provider: req.Provider, Region: req.Region,
		InstanceType: req.InstanceType, OperationID: req.OperationId})
	if err != nil {
		return nil, err
	}
	return &v1.ProvisionInstanceResponse{
		Instance: InstanceProto(res.Instance, res.Node.Name), TaskId: res.TaskID.String(), BootstrapToken: res.Token,
		CaFingerprint: a.CA.Fingerprint(), ControlPlaneUrl: a.AgentURL, Existing: res.Existed,
	}, nil
}

func (a *adminServer) GetInstance(ctx context.Context, req *v1.GetInstanceRequest) (*v1.Instance, error) {
	if req.Id == "" {
		return nil, fail.Invalid("id", "required")
	}
	in, err := a.Store.GetInstance(ctx, req.Id)
	if err != nil {
		return nil, err
	}
	out, err := a.instanceOut(ctx, in)
	if err != nil {
		return nil, err
	}
	out.ModuleRamBytes, err = a.moduleRAM(ctx, in)
	if err != nil {
		return nil, fmt.Errorf("instance %s: module sizes: %w", in.ID, err)
	}
	if p, ok := a.Instances.Machines[in.Provider].(providers.TPMReporter); ok && in.CloudInstanceID != "" {
		out.TpmEkHash = p.TPMEKHash(in.CloudInstanceID)
	}
	return out, nil
}

// moduleRAM sums the sizes of the modules the instance reports running
// that its node's template names: a netbooted node keeps every module
// file on its /run tmpfs. A digest the template no longer names (it
// changed after the boot) is not counted.
func (a *adminServer) moduleRAM(ctx context.Context, in *store.Instance) (int64, error) {
	if len(in.RunningModules) == 0 {
		return 0, nil
	}
	n, err := a.Store.GetNodeByID(ctx, in.NodeID)
	if err != nil {
		return 0, err
	}
	tpl, err := a.Store.GetTemplateByID(ctx, n.TemplateID)
	if err != nil {
		return 0, err
	}
	running := make(map[string]bool, len(in.RunningModules))
	for _, d := range in.RunningModules {
		running[d] = true
	}
	var total int64
	for _, ref := range append(append([]store.ModuleRef(nil), tpl.RootModules...), tpl.ExtensionModules...) {
		m, err := a.Store.GetModule(ctx, ref.Name, ref.Version)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return 0, err
		}
		if running[m.Digest] {
			total += m.Size
			delete(running, m.Digest)
		}
	}
	return total, nil
}

func (a *adminServer) ListInstances(ctx context.Context, req *v1.ListInstancesRequest) (*v1.ListInstancesResponse, error) {
	p, err := page(req.PageSize, req.PageToken)
	if err != nil {
		return nil, err
	}
	var f store.InstanceFilter
	if req.Node != "" {
		n, err := a.Store.GetNode(ctx, req.Node)
		if err != nil {
			return nil, err
		}
		f.NodeID = n.ID
	}
	if req.Pool != "" {
		pl, err := a.Store.GetPool(ctx, req.Pool)
		if err != nil {
			return nil, err
		}
		f.PoolID = pl.ID
	}
	if req.Status != v1.InstanceStatus_INSTANCE_STATUS_UNSPECIFIED {
		f.Statuses = []lifecycle.State{InstanceStatusName(req.Status)}
	}
	ins, err := a.Store.ListInstances(ctx, f, p)
	if err != nil {
		return nil, err
	}
	out := &v1.ListInstancesResponse{}
	// One query for the page's node names, not one per row: a page of
	// 1,000 instances cost 1,000 lookups (75 % of the call's CPU).
	ids := make([]string, 0, len(ins))
	for _, in := range ins {
		ids = append(ids, in.NodeID)
	}
	names, err := a.Store.NodeNames(ctx, ids)
	if err != nil {
		return nil, err
	}
	iids := make([]string, 0, len(ins))
	for _, in := range ins {
		iids = append(iids, in.ID)
	}
	present, err := a.Store.ListPresence(ctx, iids)
	if err != nil {
		return nil, err
	}
	now := a.Clock.Now()
	var b budget
	for _, in := range ins {
		pi := InstanceProto(in, names[in.NodeID])
		pi.AgentPresence = presenceProto(present[in.ID], now)
		if !b.Fits(pi) {
			break
		}
		out.Instances = append(out.Instances, pi)
	}
	if b.More(len(out.Instances), len(ins), p.Limit) {
		out.NextPageToken = ins[len(out.Instances)-1].ID
	}
	return out, nil
}

func (a *adminServer) CreateBootstrapToken(ctx context.Context, req *v1.CreateBootstrapTokenRequest) (*v1.CreateBootstrapTokenResponse, error) {
	if req.InstanceId == "" {
		return nil, fail.Invalid("instance_id", "required")
	}
	if req.TtlSeconds < 0 || req.TtlSeconds > 7*24*3600 {
		return nil, fail.Invalid("ttl_seconds", "%d is out of range (0..%d)", req.TtlSeconds, 7*24*3600)
	}
	tok, exp, err := a.Instances.IssueToken(ctx, req.InstanceId, time.Duration(req.TtlSeconds)*time.Second)
	if err != nil {
		return nil, err
	}
	return &v1.CreateBootstrapTokenResponse{Token: tok, InstanceId: req.InstanceId, ExpiresAt: tsp(exp),
		CaFingerprint: a.CA.Fingerprint(), ControlPlaneUrl: a.AgentURL}, nil
}

func (a *adminServer) ListCertificates(ctx context.Context, req *v1.ListCertificatesRequest) (*v1.ListCertificatesResponse, error) {
	p, err := page(req.PageSize, req.PageToken)
	if err != nil {
		return nil, err
	}
	cs, err := a.Store.ListCertificates(ctx, store.CertificateFilter{InstanceID: req.InstanceId}, p)
	if err != nil {
		return nil, err
	}
	out := &v1.ListCertificatesResponse{}
	var b budget
	for _, c := range cs {
		pc := certProto(c)
		if !b.Fits(pc) {
			break
		}
		out.Certificates = append(out.Certificates, pc)
	}
	if b.More(len(out.Certificates), len(cs), p.Limit) {
		out.NextPageToken = cs[len(out.Certificates)-1].Serial
	}
	return out, nil
}

func (a *adminServer) RevokeCertificate(ctx context.Context, req *v1.RevokeCertificateRequest) (*v1.Certificate, error) {
	if req.Serial == "" {
		return nil, fail.Invalid("serial", "required")
	}
	if len(req.Reason) > 1024 {
		return nil, fail.Invalid("reason", "longer than 1024 characters")
	}
	caller, _ := CallerFrom(ctx)
	c, err := a.Certificates.Revoke(ctx, req.Serial, req.Reason, caller.Identity.Name)
	if err != nil {
		return nil, err
	}
	a.Revoked.Add(c.Serial)
	return certProto(c), nil
}
