// Package fleet serves the fleet's instances, bootstrap tokens and
// certificates in AdminService (design §2): provision, get and list
// instances, mint a token, list and revoke certificates. The logic lives
// in controlplane/instances and controlplane/certificates; these handlers
// check the request's shape and convert.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tetherfleet/tether/controlplane/api/admin/adminkit"
	"github.com/tetherfleet/tether/controlplane/certificates"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/clock"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
	"github.com/tetherfleet/tether/providers"
)

// Reads are the store reads the answers need.
type Reads interface {
	adminkit.InstanceReads
	GetInstance(ctx context.Context, id store.InstanceID) (*store.Instance, error)
	GetNode(ctx context.Context, name string) (*store.Node, error)
	GetTemplateByID(ctx context.Context, id store.TemplateID) (*store.Template, error)
	GetModule(ctx context.Context, name, version string) (*store.Module, error)
	GetPool(ctx context.Context, name string) (*store.Pool, error)
	ListInstances(ctx context.Context, f store.InstanceFilter, p store.Page) ([]*store.Instance, error)
	NodeNames(ctx context.Context, ids []store.NodeID) (map[store.NodeID]string, error)
	ListCertificates(ctx context.Context, f store.CertificateFilter, p store.Page) ([]*store.Certificate, error)
}

// Revoked is this replica's revocation set: a revoked certificate's
// streams are cut here at once.
type Revoked interface {
	Add(serials ...store.CertSerial)
}

// Config is what the fleet handlers use.
type Config struct {
	Instances    *instances.Service
	Certificates *certificates.Service
	Reads        Reads
	Clock        clock.Clock
	// CAFingerprint and AgentURL are what a provision or a token hands
	// the operator to give the node.
	CAFingerprint func() string
	AgentURL      string
	// Revoked, if set, hears a revoked serial.
	Revoked Revoked
}

// Server serves the fleet handlers.
type Server struct {
	cfg Config
}

// New builds the fleet handlers, naming a missing dependency.
func New(cfg Config) (*Server, error) {
	for _, r := range []struct {
		name    string
		missing bool
	}{{"Instances", cfg.Instances == nil}, {"Certificates", cfg.Certificates == nil}, {"Reads", cfg.Reads == nil},
		{"Clock", cfg.Clock == nil}, {"CAFingerprint", cfg.CAFingerprint == nil}} {
		if r.missing {
			return nil, errors.New("fleet: Config." + r.name + " is required")
		}
	}
	return &Server{cfg: cfg}, nil
}

func (a *Server) ProvisionInstance(ctx context.Context, req *v1.ProvisionInstanceRequest) (*v1.ProvisionInstanceResponse, error) {
	res, err := a.cfg.Instances.Provision(ctx, instances.ProvisionParams{Node: req.Node, Provider: req.Provider, Region: req.Region,
		InstanceType: req.InstanceType, OperationID: req.OperationId})
	if err != nil {
		return nil, err
	}
	return &v1.ProvisionInstanceResponse{
		Instance: adminkit.InstanceProto(res.Instance, res.Node.Name), TaskId: res.TaskID.String(), BootstrapToken: res.Token,
		CaFingerprint: a.cfg.CAFingerprint(), ControlPlaneUrl: a.cfg.AgentURL, Existing: res.Existed,
	}, nil
}

func (a *Server) GetInstance(ctx context.Context, req *v1.GetInstanceRequest) (*v1.Instance, error) {
	if req.Id == "" {
		return nil, fail.Invalid("id", "required")
	}
	in, err := a.cfg.Reads.GetInstance(ctx, store.InstanceID(req.Id))
	if err != nil {
		return nil, err
	}
	out, err := adminkit.InstanceOut(ctx, a.cfg.Reads, a.cfg.Clock.Now(), in)
	if err != nil {
		return nil, err
	}
	out.ModuleRamBytes, err = a.moduleRAM(ctx, in)
	if err != nil {
		return nil, fmt.Errorf("instance %s: module sizes: %w", in.ID, err)
	}
	if p, ok := a.cfg.Instances.Machines[in.Provider].(providers.TPMReporter); ok && in.CloudInstanceID != "" {
		out.TpmEkHash = p.TPMEKHash(in.CloudInstanceID)
	}
	return out, nil
}

// moduleRAM sums the sizes of the modules the instance reports running
// that its node's template names: a netbooted node keeps every module
// file on its /run tmpfs. A digest the template no longer names (it
// changed after the boot) is not counted.
func (a *Server) moduleRAM(ctx context.Context, in *store.Instance) (int64, error) {
	if len(in.RunningModules) == 0 {
		return 0, nil
	}
	n, err := a.cfg.Reads.GetNodeByID(ctx, in.NodeID)
	if err != nil {
		return 0, err
	}
	tpl, err := a.cfg.Reads.GetTemplateByID(ctx, n.TemplateID)
	if err != nil {
		return 0, err
	}
	running := make(map[string]bool, len(in.RunningModules))
	for _, d := range in.RunningModules {
		running[d] = true
	}
	var total int64
	for _, ref := range append(append([]store.ModuleRef(nil), tpl.RootModules...), tpl.ExtensionModules...) {
		m, err := a.cfg.Reads.GetModule(ctx, ref.Name, ref.Version)
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

func (a *Server) ListInstances(ctx context.Context, req *v1.ListInstancesRequest) (*v1.ListInstancesResponse, error) {
	p, err := adminkit.Page(req.PageSize, req.PageToken)
	if err != nil {
		return nil, err
	}
	var f store.InstanceFilter
	if req.Node != "" {
		n, err := a.cfg.Reads.GetNode(ctx, req.Node)
		if err != nil {
			return nil, err
		}
		f.NodeID = n.ID
	}
	if req.Pool != "" {
		pl, err := a.cfg.Reads.GetPool(ctx, req.Pool)
		if err != nil {
			return nil, err
		}
		f.PoolID = pl.ID
	}
	if req.Status != v1.InstanceStatus_INSTANCE_STATUS_UNSPECIFIED {
		f.Statuses = []lifecycle.State{adminkit.InstanceStatusName(req.Status)}
	}
	ins, err := a.cfg.Reads.ListInstances(ctx, f, p)
	if err != nil {
		return nil, err
	}
	out := &v1.ListInstancesResponse{}
	// One query for the page's node names, not one per row: a page of
	// 1,000 instances cost 1,000 lookups (75 % of the call's CPU).
	ids := make([]store.NodeID, 0, len(ins))
	for _, in := range ins {
		ids = append(ids, in.NodeID)
	}
	names, err := a.cfg.Reads.NodeNames(ctx, ids)
	if err != nil {
		return nil, err
	}
	iids := make([]store.InstanceID, 0, len(ins))
	for _, in := range ins {
		iids = append(iids, in.ID)
	}
	present, err := a.cfg.Reads.ListPresence(ctx, iids)
	if err != nil {
		return nil, err
	}
	now := a.cfg.Clock.Now()
	if out.Instances, out.NextPageToken, err = adminkit.Fill(ins, p.Limit,
		func(in *store.Instance) (*v1.Instance, error) {
			pi := adminkit.InstanceProto(in, names[in.NodeID])
			pi.AgentPresence = adminkit.PresenceProto(present[in.ID], now)
			return pi, nil
		},
		func(in *store.Instance) string { return in.ID.String() }); err != nil {
		return nil, err
	}
	return out, nil
}

func (a *Server) CreateBootstrapToken(ctx context.Context, req *v1.CreateBootstrapTokenRequest) (*v1.CreateBootstrapTokenResponse, error) {
	if req.InstanceId == "" {
		return nil, fail.Invalid("instance_id", "required")
	}
	if req.TtlSeconds < 0 || req.TtlSeconds > 7*24*3600 {
		return nil, fail.Invalid("ttl_seconds", "%d is out of range (0..%d)", req.TtlSeconds, 7*24*3600)
	}
	tok, exp, err := a.cfg.Instances.IssueToken(ctx, store.InstanceID(req.InstanceId), time.Duration(req.TtlSeconds)*time.Second)
	if err != nil {
		return nil, err
	}
	return &v1.CreateBootstrapTokenResponse{Token: tok, InstanceId: req.InstanceId, ExpiresAt: adminkit.Timestamp(exp),
		CaFingerprint: a.cfg.CAFingerprint(), ControlPlaneUrl: a.cfg.AgentURL}, nil
}

func (a *Server) ListCertificates(ctx context.Context, req *v1.ListCertificatesRequest) (*v1.ListCertificatesResponse, error) {
	p, err := adminkit.Page(req.PageSize, req.PageToken)
	if err != nil {
		return nil, err
	}
	cs, err := a.cfg.Reads.ListCertificates(ctx, store.CertificateFilter{InstanceID: store.InstanceID(req.InstanceId)}, p)
	if err != nil {
		return nil, err
	}
	out := &v1.ListCertificatesResponse{}
	if out.Certificates, out.NextPageToken, err = adminkit.Fill(cs, p.Limit,
		func(c *store.Certificate) (*v1.Certificate, error) { return adminkit.CertProto(c), nil },
		func(c *store.Certificate) string { return c.Serial.String() }); err != nil {
		return nil, err
	}
	return out, nil
}

func (a *Server) RevokeCertificate(ctx context.Context, req *v1.RevokeCertificateRequest) (*v1.Certificate, error) {
	if req.Serial == "" {
		return nil, fail.Invalid("serial", "required")
	}
	if len(req.Reason) > 1024 {
		return nil, fail.Invalid("reason", "longer than 1024 characters")
	}
	caller, _ := adminkit.CallerFrom(ctx)
	c, err := a.cfg.Certificates.Revoke(ctx, store.CertSerial(req.Serial), req.Reason, caller.Identity.Name)
	if err != nil {
		return nil, err
	}
	if a.cfg.Revoked != nil {
		a.cfg.Revoked.Add(c.Serial)
	}
	return adminkit.CertProto(c), nil
}
