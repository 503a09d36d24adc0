// Package bmc answers the redfish provider's questions about nodes: where
// a node's BMC is, which credential opens it (unsealed here, for the
// length of one call) and how its certificate is verified. The provider
// knows machines only by id (redfish:<node>); this is the small lookup
// over the store it is given instead of the store itself
// (docs/adr/0012-redfish-provider-resolves-nodes-through-a-lookup.md).
package bmc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/tetherfleet/tether/controlplane/credentials"
	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/providers/redfish"
)

// Resolver implements redfish.Resolver over the store.
type Resolver struct {
	Store       store.Store
	Credentials *credentials.Service
	Clock       clock.Clock
	Log         *slog.Logger
}

var _ redfish.Resolver = (*Resolver)(nil)

// Target implements redfish.Resolver.
func (r *Resolver) Target(ctx context.Context, node string) (redfish.Target, error) {
	n, err := r.Store.GetNode(ctx, node)
	if errors.Is(err, store.ErrNotFound) {
		return redfish.Target{}, fmt.Errorf("node %s does not exist: %w", node, redfish.ErrNoBMC)
	}
	if err != nil {
		return redfish.Target{}, err
	}
	if n.BMC.Address == "" {
		return redfish.Target{}, fmt.Errorf("node %s names no BMC: %w", node, redfish.ErrNoBMC)
	}
	return r.target(ctx, n)
}

// Targets implements redfish.Resolver. A node whose credential cannot be
// opened is still listed (by name and instance): its machine exists, and
// the provider reports it as unknown with the reason.
func (r *Resolver) Targets(ctx context.Context) ([]redfish.Target, error) {
	var out []redfish.Target
	page := store.Page{Limit: store.MaxPageSize}
	for {
		ns, err := r.Store.ListNodes(ctx, store.NodeFilter{HasBMC: true}, page)
		if err != nil {
			return nil, err
		}
		for _, n := range ns {
			t, err := r.target(ctx, n)
			if err != nil && !errors.Is(err, redfish.ErrMisconfigured) {
				return nil, err
			}
			out = append(out, t)
		}
		if len(ns) < page.Limit {
			return out, nil
		}
		page.After = ns[len(ns)-1].Name
	}
}

func (r *Resolver) target(ctx context.Context, n *store.Node) (redfish.Target, error) {
	t := redfish.Target{Node: n.Name, Address: n.BMC.Address, BootMode: n.BMC.BootMode,
		TLS: redfish.TLS{CAPEM: []byte(n.BMC.CAPEM), Fingerprint: n.BMC.Fingerprint, InsecureSkipVerify: n.BMC.Insecure}}
	var err error
	if t.InstanceID, err = r.instanceOf(ctx, n); err != nil {
		return redfish.Target{}, err
	}
	t.Username, t.Password, err = r.Credentials.Open(ctx, r.Store, n.BMC.Credential)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return t, fmt.Errorf("node %s names credential %q, which does not exist: %w", n.Name, n.BMC.Credential, redfish.ErrMisconfigured)
	case err != nil && !errors.Is(err, store.ErrUnavailable):
		return t, fmt.Errorf("node %s: %v: %w", n.Name, err, redfish.ErrMisconfigured)
	}
	return t, err
}

// instanceOf is the live instance that recorded this node's machine:
// only a recorded machine is attributed, so a provision that failed is
// never taken for one whose answer was lost.
func (r *Resolver) instanceOf(ctx context.Context, n *store.Node) (string, error) {
	ins, err := r.Store.ListInstances(ctx, store.InstanceFilter{NodeID: n.ID, Provider: redfish.Name}, store.Page{Limit: store.MaxPageSize})
	if err != nil {
		return "", err
	}
	for _, in := range ins {
		if !in.Status.Terminal() && in.CloudInstanceID == redfish.MachineID(n.Name) {
			return in.ID.String(), nil
		}
	}
	return "", nil
}

// Warn writes the warning event of a BMC used without TLS verification.
func (r *Resolver) Warn(ctx context.Context, node, msg string) {
	now := r.Clock.Now()
	err := r.Store.Tx(context.WithoutCancel(ctx), func(q store.Queries) error {
		_, err := events.E{Kind: events.BMCTLSUnverified, Severity: events.Medium, Message: msg,
			Payload: events.BMCTLSUnverifiedPayload{Node: node}}.Write(ctx, q, now)
		return err
	})
	if err != nil && r.Log != nil {
		r.Log.Warn("record the event of an unverified BMC", "node", node, "err", err)
	}
}
