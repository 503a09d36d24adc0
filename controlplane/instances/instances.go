// Package instances drives instances through the lifecycle (SPEC 2):
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
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/pki"
)

// DefaultTokenTTL is how long a bootstrap token lives (SPEC 3.1).
const DefaultTokenTTL = 24 * time.Hour

// ProviderExternal is the provider for machines something else starts.
const ProviderExternal = "external"

// Clock is the time source.
type Clock interface{ Now() time.Time }

// Service is the instance service.
type Service struct {
	Store store.Store
	Clock Clock
	Log   *slog.Logger
	// Providers lists the provider names provisioning accepts.
	Providers []string
	TokenTTL  time.Duration
}

// ProvisionParams is a provision request.
type ProvisionParams struct {
	Node, Provider, Region, InstanceType, OperationID string
	// Pool fields, set by the pool service for members.
	PoolID string
}

// Provisioned is the result of Provision.
type Provisioned struct {
	Instance *store.Instance
	Node     *store.Node
	// Token is set only for the external provider on the call that created
	// the instance: it is shown once.
	Token   string
	TaskID  string
	Existed bool
}

// Provision creates an instance of a node. A retry with the same
// operation id returns the first call's instance and creates nothing.
func (s *Service) Provision(ctx context.Context, p ProvisionParams) (*Provisioned, error) {
	if p.Node == "" {
		return nil, fail.Invalid("node", "required")
	}
	if p.Provider == "" {
		return nil, fail.Invalid("provider", "required (one of %v)", s.Providers)
	}
	if !contains(s.Providers, p.Provider) {
		return nil, fail.Invalid("provider", "%q is not configured here (configured: %v)", p.Provider, s.Providers)
	}
	if len(p.OperationID) > 128 {
		return nil, fail.Invalid("operation_id", "at most 128 characters")
	}
	if p.OperationID != "" {
		if got, err := s.existing(ctx, p.OperationID); got != nil || err != nil {
			return got, err
		}
	}
	node, err := s.Store.GetNode(ctx, p.Node)
	if err != nil {
		return nil, err
	}
	if !node.Enabled {
		return nil, fail.Precondition("node %q is disabled; enable it (tetherctl node update %s --enabled) before provisioning", node.Name, node.Name)
	}
	now := s.Clock.Now()
	in := &store.Instance{
		NodeID: node.ID, Status: string(lifecycle.Pending), Provider: p.Provider, Region: p.Region,
		InstanceType: p.InstanceType, OperationID: p.OperationID, CreatedAt: now, UpdatedAt: now,
	}
	out := &Provisioned{Instance: in, Node: node}
	err = s.Store.Tx(ctx, func(q store.Queries) error {
		if err := q.CreateInstance(ctx, in); err != nil {
			return err
		}
		if _, err := (events.E{Kind: events.InstanceProvisioned, InstanceID: in.ID,
			Message: fmt.Sprintf("instance of node %s created on provider %s", node.Name, p.Provider),
			Payload: map[string]any{"node": node.Name, "provider": p.Provider, "operation_id": p.OperationID}}).Write(ctx, q, now); err != nil {
			return err
		}
		if p.Provider != ProviderExternal {
			return fail.Precondition("provider %q has no provisioning worker yet", p.Provider)
		}
		// Nothing creates an external machine: the operator boots it with
		// the token, so the instance enters its boot window at once.
		if err := s.transition(ctx, q, in, lifecycle.MarkProvisioning, "external machine awaiting boot", now); err != nil {
			return err
		}
		tok, err := s.issueToken(ctx, q, in.ID, now)
		out.Token = tok
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
	return &Provisioned{Instance: in, Node: node, Existed: true}, nil
}

// IssueToken makes a fresh bootstrap token for an instance that is not
// terminated. The token is returned once and stored as a hash.
func (s *Service) IssueToken(ctx context.Context, instanceID string, ttl time.Duration) (string, time.Time, error) {
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
		if lifecycle.State(in.Status).Terminal() {
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

func (s *Service) issueToken(ctx context.Context, q store.Queries, instanceID string, now time.Time) (string, error) {
	return s.issueTokenTTL(ctx, q, instanceID, now, s.ttl())
}

func (s *Service) issueTokenTTL(ctx context.Context, q store.Queries, instanceID string, now time.Time, ttl time.Duration) (string, error) {
	token, hash, err := pki.NewToken()
	if err != nil {
		return "", err
	}
	if err := q.CreateToken(ctx, &store.Token{Hash: hash, InstanceID: instanceID, ExpiresAt: now.Add(ttl), CreatedAt: now}); err != nil {
		return "", err
	}
	_, err = events.E{Kind: events.TokenIssued, InstanceID: instanceID, Message: "bootstrap token issued",
		Payload: map[string]any{"expires_at": now.Add(ttl).UTC().Format(time.RFC3339)}}.Write(ctx, q, now)
	return token, err
}

// transition applies ev to in (already read in q's transaction), writes
// the row and an event. A refused pair is a *lifecycle.TransitionError.
func (s *Service) transition(ctx context.Context, q store.Queries, in *store.Instance, ev lifecycle.Event, reason string, now time.Time) error {
	from := lifecycle.State(in.Status)
	to, err := lifecycle.Next(from, ev)
	if err != nil {
		return err
	}
	in.Status, in.UpdatedAt = string(to), now
	if err := q.UpdateInstance(ctx, in); err != nil {
		return err
	}
	_, err = events.E{Kind: events.InstanceTransition, InstanceID: in.ID,
		Message: fmt.Sprintf("%s: %s -> %s (%s)", ev, from, to, reason),
		Payload: map[string]any{"event": string(ev), "from": string(from), "to": string(to), "reason": reason}}.Write(ctx, q, now)
	return err
}

// Transition applies ev to an instance in its own transaction.
func (s *Service) Transition(ctx context.Context, id string, ev lifecycle.Event, reason string) (*store.Instance, error) {
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

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}
