// Package instances drives instances through the lifecycle (docs/design.md §2):
// provisioning, enrollment material, and the transitions operators and
// agents cause. Every change runs in one transaction with its event.
package instances

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/worker"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/pki"
	"github.com/tetherfleet/tether/providers"
)

// DefaultTokenTTL is how long a bootstrap token lives (docs/design.md §3.1).
const DefaultTokenTTL = 24 * time.Hour

// ProviderExternal is the provider for machines something else starts.
const ProviderExternal = "external"

// Service is the instance service.
type Service struct {
	Store store.Store
	Clock clock.Clock
	Log   *slog.Logger
	// Machines are the configured providers by name: what provisioning
	// accepts and what the power operations drive.
	Machines map[string]providers.Provider
	TokenTTL time.Duration
	// Artifacts resolves a template's kernel and initramfs.
	Artifacts *Artifacts
	// AgentURL and CAFingerprint are the enrollment data handed to every
	// boot with its fresh token.
	AgentURL      string
	CAFingerprint string
	// CA, when set, gives the fingerprint at each hand-off instead of
	// CAFingerprint: after a rotation's activate, boots pin the new CA
	// (design §3.10).
	CA interface{ Fingerprint() string }
	// Owner names this replica in the leases of the provider operations
	// it runs inside API calls (see worker.NewOwner).
	Owner string
	// Lease is how long an operation holds its task between renewals
	// (zero: worker.DefaultLease).
	Lease time.Duration
	// OpTimeout bounds one provider call (zero: DefaultOpTimeout).
	OpTimeout time.Duration
	// ProvisionAttempts and RetryBackoff shape how a provision task
	// retries transient provider failures before it gives up (zero:
	// DefaultProvisionAttempts, DefaultRetryBackoff, doubling).
	ProvisionAttempts int
	RetryBackoff      time.Duration
	// SelfInstanceIDs are instances that host this control plane: drain
	// refuses them (stopping them would stop us).
	SelfInstanceIDs []string
	// Pools, if set, hears of members taken out of their pool's counts.
	Pools PoolEvents
}

// PoolEvents is told the pool of a member that a committed change took
// out of its pool's counts (terminated, errored, or fenced by a cordon),
// so the pool can replace it at once. It must not block. The pool
// service's queue (pool.Nudges) is one, made before both services, so
// neither is patched after it is built.
type PoolEvents interface {
	MemberLeft(poolID store.PoolID)
}

// memberLeft reports a member gone from its pool's counts.
func (s *Service) memberLeft(in *store.Instance) {
	if in != nil {
		s.MemberLeft(in.PoolID)
	}
}

// MemberLeft tells Pools, if set, that poolID lost a member.
func (s *Service) MemberLeft(poolID store.PoolID) {
	if s.Pools != nil && poolID != "" {
		s.Pools.MemberLeft(poolID)
	}
}

// Defaults for Service's zero values.
const (
	DefaultOpTimeout         = 2 * time.Minute
	DefaultProvisionAttempts = 3
	DefaultRetryBackoff      = 2 * time.Second
)

// ProvisionParams is a provision request.
type ProvisionParams struct {
	Node, Provider, Region, InstanceType, OperationID string
	// Pool fields, set by the pool service for members.
	PoolID store.PoolID
}

// Provisioned is the result of Provision.
type Provisioned struct {
	Instance *store.Instance
	Node     *store.Node
	// Token is set only for the external provider on the call that created
	// the instance: it is shown once.
	Token   string
	TaskID  store.TaskID
	Existed bool
}

// Provision creates an instance of a node. A retry with the same
// operation id returns the first call's instance and creates nothing.
func (s *Service) Provision(ctx context.Context, p ProvisionParams) (*Provisioned, error) {
	if err := s.checkProvision(p); err != nil {
		return nil, err
	}
	if p.OperationID != "" {
		if got, err := s.existing(ctx, p.OperationID); got != nil || err != nil {
			return got, err
		}
	}
	var out *Provisioned
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		var err error
		out, err = s.ProvisionTx(ctx, q, p)
		return err
	})
	if errors.Is(err, store.ErrAlreadyExists) && p.OperationID != "" {
		// Lost a race with a concurrent retry carrying the same id.
		return s.existing(ctx, p.OperationID)
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// checkProvision refuses a request before anything is read.
func (s *Service) checkProvision(p ProvisionParams) error {
	if p.Node == "" {
		return fail.Invalid("node", "required")
	}
	if p.Provider == "" {
		return fail.Invalid("provider", "required (one of %v)", s.ProviderNames())
	}
	if _, ok := s.Machines[p.Provider]; !ok {
		return fail.Invalid("provider", "%q is not configured here (configured: %v)", p.Provider, s.ProviderNames())
	}
	for _, f := range []struct{ name, v string }{{"region", p.Region}, {"instance_type", p.InstanceType}} {
		if len(f.v) > 128 {
			return fail.Invalid(f.name, "at most 128 characters")
		}
	}
	if len(p.OperationID) > 128 {
		return fail.Invalid("operation_id", "at most 128 characters")
	}
	if p.PoolID != "" && p.Provider == ProviderExternal {
		// Nothing boots an external machine but an operator holding its
		// token, and a pool member's token reaches no operator.
		return fail.Invalid("provider", "a pool member cannot use the %s provider", ProviderExternal)
	}
	return nil
}

// ProvisionTx is Provision inside the caller's transaction: the pool
// service creates a member's node and its instance together, so a crash
// cannot leave a node with no member. A member (p.PoolID set) is created
// warming, its warm-up clock started, in the same insert.
func (s *Service) ProvisionTx(ctx context.Context, q store.Queries, p ProvisionParams) (*Provisioned, error) {
	if err := s.checkProvision(p); err != nil {
		return nil, err
	}
	if p.OperationID != "" {
		in, err := q.GetInstanceByOperationID(ctx, p.OperationID)
		if err == nil {
			node, err := q.GetNodeByID(ctx, in.NodeID)
			if err != nil {
				return nil, err
			}
			return &Provisioned{Instance: in, Node: node, Existed: true}, nil
		}
		if !errors.Is(err, store.ErrNotFound) {
			return nil, err
		}
	}
	prov := s.Machines[p.Provider]
	node, err := q.GetNode(ctx, p.Node)
	if err != nil {
		return nil, err
	}
	if !node.Enabled {
		return nil, fail.Precondition("node %q is disabled; enable it (tetherctl node update %s --enabled) before provisioning", node.Name, node.Name)
	}
	tpl, err := q.GetTemplateByID(ctx, node.TemplateID)
	if err != nil {
		return nil, err
	}
	// A template that requires signers refuses a module they did not sign
	// here, at assignment time, rather than as a node's failed boot.
	if err := modules.CheckTemplateSigners(ctx, q, tpl); err != nil {
		return nil, err
	}
	if p.Provider != ProviderExternal {
		// Refuse now what the worker could only fail later: a machine
		// that has no kernel to boot.
		if _, _, err := s.Artifacts.Digests(tpl); err != nil {
			return nil, err
		}
	}
	now := s.Clock.Now()
	in := &store.Instance{
		NodeID: node.ID, Status: lifecycle.Pending, Provider: p.Provider, Region: p.Region,
		InstanceType: p.InstanceType, OperationID: p.OperationID, CreatedAt: now, UpdatedAt: now,
	}
	if p.PoolID != "" {
		in.PoolID, in.PoolState, in.PoolWarmingStartedAt = p.PoolID, lifecycle.PoolWarming, &now
	}
	out := &Provisioned{Instance: in, Node: node}
	if err := q.CreateInstance(ctx, in); err != nil {
		return nil, err
	}
	if _, err := (events.E{Kind: events.InstanceProvisioned, InstanceID: in.ID, PoolID: p.PoolID,
		Message: fmt.Sprintf("instance of node %s created on provider %s", node.Name, p.Provider),
		Payload: events.ProvisionedPayload{Node: node.Name, OperationID: p.OperationID, PoolID: p.PoolID, Provider: p.Provider}}).Write(ctx, q, now); err != nil {
		return nil, err
	}
	if p.Provider != ProviderExternal {
		// A worker creates the machine; the call returns at once.
		t := &store.Task{InstanceID: in.ID, Kind: TaskProvision, CreatedAt: now, UpdatedAt: now}
		if err := worker.Enqueue(ctx, q, t); err != nil {
			return nil, err
		}
		out.TaskID = t.ID
		if _, err := (events.E{Kind: events.TaskCreated, InstanceID: in.ID, CorrelationID: t.ID.Correlation(),
			Message: fmt.Sprintf("provision task %s created", t.ID)}).Write(ctx, q, now); err != nil {
			return nil, err
		}
		return out, nil
	}
	// Nothing creates an external machine: the operator boots it with
	// the token, so the instance enters its boot window at once. The
	// provider only names the machine (it acts on nothing). A node with a
	// TPM bound gets no token: its machine proves itself (docs/adr/0023).
	m, err := prov.Provision(ctx, providers.Spec{InstanceID: in.ID.String(), Region: in.Region, InstanceType: in.InstanceType})
	if err != nil {
		return nil, err
	}
	in.CloudInstanceID = m.ID
	if err := s.transition(ctx, q, in, lifecycle.MarkProvisioning, "external machine awaiting boot", now); err != nil {
		return nil, err
	}
	if out.Token, err = s.BootToken(ctx, q, in, now); err != nil {
		return nil, err
	}
	return out, nil
}

func (s *Service) existing(ctx context.Context, opID string) (*Provisioned, error) {
	in, err := s.Store.GetInstanceByOperationID(ctx, opID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	node, err := s.Store.GetNodeByID(ctx, in.NodeID)
	if err != nil {
		return nil, err
	}
	out := &Provisioned{Instance: in, Node: node, Existed: true}
	ts, err := s.Store.ListTasks(ctx, store.TaskFilter{InstanceID: in.ID, Target: store.TaskTargetWorker}, store.Page{Limit: store.MaxPageSize})
	if err != nil {
		return nil, err
	}
	for _, t := range ts {
		if t.Kind == TaskProvision {
			out.TaskID = t.ID
			break
		}
	}
	return out, nil
}

// IssueToken makes a fresh bootstrap token for an instance that is not
// terminated. The token is returned once and stored as a hash.
func (s *Service) IssueToken(ctx context.Context, instanceID store.InstanceID, ttl time.Duration) (string, time.Time, error) {
	now := s.Clock.Now()
	if ttl <= 0 {
		ttl = s.ttl()
	}
	var token string
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		in, err := q.GetInstance(ctx, instanceID)
		if err != nil {
			return err
		}
		if in.Status.Terminal() {
			return fail.Precondition("instance %s is terminated; it cannot enroll again", instanceID)
		}
		token, err = s.issueTokenTTL(ctx, q, instanceID, now, ttl)
		return err
	})
	return token, now.Add(ttl), err
}

func (s *Service) ttl() time.Duration {
	if s.TokenTTL > 0 {
		return s.TokenTTL
	}
	return DefaultTokenTTL
}

func (s *Service) issueToken(ctx context.Context, q store.Queries, instanceID store.InstanceID, now time.Time) (string, error) {
	return s.issueTokenTTL(ctx, q, instanceID, now, s.ttl())
}

func (s *Service) issueTokenTTL(ctx context.Context, q store.Queries, instanceID store.InstanceID, now time.Time, ttl time.Duration) (string, error) {
	token, hash, err := pki.NewToken()
	if err != nil {
		return "", err
	}
	// An instance holds one live token: the newest. A token handed out
	// earlier (the provision printout's, an earlier boot's script's) and
	// not spent ends here, so a copy of it left in a terminal, a log or a
	// cached script opens nothing (design §3.1).
	superseded, err := q.ExpireInstanceTokens(ctx, instanceID, now)
	if err != nil {
		return "", err
	}
	if err := q.CreateToken(ctx, &store.Token{Hash: hash, InstanceID: instanceID, ExpiresAt: now.Add(ttl), CreatedAt: now}); err != nil {
		return "", err
	}
	_, err = events.E{Kind: events.TokenIssued, InstanceID: instanceID, Message: "bootstrap token issued",
		Payload: events.TokenIssuedPayload{ExpiresAt: now.Add(ttl).UTC().Format(time.RFC3339), Superseded: superseded}}.Write(ctx, q, now)
	return token, err
}

// transition applies ev to in (already read in q's transaction), writes
// the row and an event. A refused pair is a *lifecycle.TransitionError.
func (s *Service) transition(ctx context.Context, q store.Queries, in *store.Instance, ev lifecycle.Event, reason string, now time.Time) error {
	from := in.Status
	to, err := lifecycle.Next(from, ev)
	if err != nil {
		return err
	}
	in.Status, in.UpdatedAt = to, now
	if err := q.UpdateInstance(ctx, in); err != nil {
		return err
	}
	_, err = events.E{Kind: events.InstanceTransition, InstanceID: in.ID,
		Message: fmt.Sprintf("%s: %s -> %s (%s)", ev, from, to, reason),
		Payload: events.TransitionPayload{Event: string(ev), From: string(from), Reason: reason, To: string(to)}}.Write(ctx, q, now)
	return err
}

// Transition applies ev to an instance in its own transaction.
func (s *Service) Transition(ctx context.Context, id store.InstanceID, ev lifecycle.Event, reason string) (*store.Instance, error) {
	var in *store.Instance
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		var err error
		if in, err = q.LockInstance(ctx, id); err != nil {
			return err
		}
		return s.transition(ctx, q, in, ev, reason, s.Clock.Now())
	})
	return in, err
}

// TransitionTx applies ev to in (read and locked in q's transaction),
// writing the row and the transition event. Loops that decide on their
// own (liveness, provider sync) use it to change state under their lock.
func (s *Service) TransitionTx(ctx context.Context, q store.Queries, in *store.Instance, ev lifecycle.Event, reason string, now time.Time) error {
	return s.transition(ctx, q, in, ev, reason, now)
}

// Fingerprint is the CA fingerprint handed to a boot now: the active CA's.
func (s *Service) Fingerprint() string {
	if s.CA != nil {
		return s.CA.Fingerprint()
	}
	return s.CAFingerprint
}
