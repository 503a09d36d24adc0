package api

import (
	"context"
	"errors"
	"fmt"
	"github.com/tetherfleet/tether/providers"
	"strconv"
	"time"

	"github.com/tetherfleet/tether/controlplane/api/protoconv"
	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/tasks"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// Instances, tokens, certificates, tasks and events.

func (a *adminServer) instanceOut(ctx context.Context, in *store.Instance) (*v1.Instance, error) {
	n, err := a.Store.GetNodeByID(ctx, in.NodeID)
	if err != nil {
		return nil, err
	}
	out := InstanceProto(in, n.Name)
	ps, err := a.Store.ListPresence(ctx, []string{in.ID})
	if err != nil {
		return nil, err
	}
	out.AgentPresence = presenceProto(ps[in.ID], a.Clock.Now())
	return out, nil
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
		if !b.fits(pi) {
			break
		}
		out.Instances = append(out.Instances, pi)
	}
	if b.more(len(out.Instances), len(ins), p.Limit) {
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
		if !b.fits(pc) {
			break
		}
		out.Certificates = append(out.Certificates, pc)
	}
	if b.more(len(out.Certificates), len(cs), p.Limit) {
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

func (a *adminServer) CreateTask(ctx context.Context, req *v1.CreateTaskRequest) (*v1.Task, error) {
	var exec *tasks.Exec
	if req.Exec != nil {
		exec = &tasks.Exec{Argv: req.Exec.Argv, TimeoutSeconds: req.Exec.TimeoutSeconds}
	}
	if req.Kind == v1.TaskKind_TASK_KIND_UNSPECIFIED {
		return nil, fail.Invalid("kind", "required")
	}
	kind, err := protoconv.TaskKindFrom(req.Kind)
	if err != nil {
		return nil, fail.Invalid("kind", "%v", err)
	}
	t, err := a.Tasks.CreateAgentTask(ctx, req.InstanceId, kind, exec, int(req.MaxAttempts))
	if err != nil {
		return nil, err
	}
	return TaskProto(t), nil
}

func (a *adminServer) GetTask(ctx context.Context, req *v1.GetTaskRequest) (*v1.Task, error) {
	if req.Id == "" {
		return nil, fail.Invalid("id", "required")
	}
	t, err := a.Store.GetTask(ctx, store.TaskID(req.Id))
	if err != nil {
		return nil, err
	}
	return TaskProto(t), nil
}

func (a *adminServer) ListTasks(ctx context.Context, req *v1.ListTasksRequest) (*v1.ListTasksResponse, error) {
	p, err := page(req.PageSize, req.PageToken)
	if err != nil {
		return nil, err
	}
	target, err := protoconv.TaskTargetFrom(req.Target)
	if err != nil {
		return nil, fail.Invalid("target", "%v", err)
	}
	status, err := protoconv.TaskStatusFrom(req.Status)
	if err != nil {
		return nil, fail.Invalid("status", "%v", err)
	}
	f := store.TaskFilter{InstanceID: req.InstanceId, Target: target}
	if status != "" {
		f.Statuses = []store.TaskStatus{status}
	}
	ts, err := a.Store.ListTasks(ctx, f, p)
	if err != nil {
		return nil, err
	}
	out := &v1.ListTasksResponse{}
	var b budget
	for _, t := range ts {
		pt := TaskProto(t)
		if !b.fits(pt) {
			break
		}
		out.Tasks = append(out.Tasks, pt)
	}
	if b.more(len(out.Tasks), len(ts), p.Limit) {
		out.NextPageToken = ts[len(out.Tasks)-1].ID.String()
	}
	return out, nil
}

func (a *adminServer) CancelTask(ctx context.Context, req *v1.CancelTaskRequest) (*v1.Task, error) {
	if req.Id == "" {
		return nil, fail.Invalid("id", "required")
	}
	t, err := a.Tasks.Cancel(ctx, store.TaskID(req.Id))
	if err != nil {
		return nil, err
	}
	return TaskProto(t), nil
}

func eventFilter(kind, instance, pool, corr string, sev v1.Severity) (store.EventFilter, error) {
	for _, f := range []struct{ name, v string }{{"kind", kind}, {"instance_id", instance}, {"pool_id", pool}, {"correlation_id", corr}} {
		if len(f.v) > 256 {
			return store.EventFilter{}, fail.Invalid(f.name, "longer than 256 characters")
		}
	}
	min, err := protoconv.SeverityFrom(sev)
	if err != nil {
		return store.EventFilter{}, fail.Invalid("min_severity", "%v", err)
	}
	// The kind is not checked against the vocabulary: the log keeps the
	// kinds of every version that wrote it (docs/adr/0050).
	return store.EventFilter{Kind: store.EventKind(kind), InstanceID: instance, PoolID: pool, CorrelationID: corr, MinSeverity: min}, nil
}

func (a *adminServer) ListEvents(ctx context.Context, req *v1.ListEventsRequest) (*v1.ListEventsResponse, error) {
	p, err := page(req.PageSize, req.PageToken)
	if err != nil {
		return nil, err
	}
	if p.After != "" {
		if _, err := strconv.ParseInt(p.After, 10, 64); err != nil {
			return nil, fail.Invalid("page_token", "not a token this server issued")
		}
	}
	f, err := eventFilter(req.Kind, req.InstanceId, req.PoolId, req.CorrelationId, req.MinSeverity)
	if err != nil {
		return nil, err
	}
	evs, err := a.Store.ListEvents(ctx, f, p)
	if err != nil {
		return nil, err
	}
	out := &v1.ListEventsResponse{}
	var b budget
	for _, e := range evs {
		pe := eventProto(e)
		if !b.fits(pe) {
			break
		}
		out.Events = append(out.Events, pe)
	}
	if b.more(len(out.Events), len(evs), p.Limit) {
		out.NextPageToken = strconv.FormatInt(evs[len(out.Events)-1].ID, 10)
	}
	return out, nil
}

// WatchEvents streams new events from now on.
func (a *adminServer) WatchEvents(req *v1.WatchEventsRequest, stream v1.AdminService_WatchEventsServer) error {
	f, err := eventFilter(req.Kind, req.InstanceId, req.PoolId, req.CorrelationId, req.MinSeverity)
	if err != nil {
		return err
	}
	ctx := stream.Context()
	from, err := a.Store.LatestEventID(ctx)
	if err != nil {
		return err
	}
	err = events.Watch(ctx, a.Store, f, from, 2*time.Second, func(e *store.Event) error { return stream.Send(eventProto(e)) })
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
