package libvirt

import (
	"context"
	"fmt"
	"strings"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/tetherfleet/tether/providers"
)

// eventRetry is how long the event follower waits before reconnecting to a
// libvirtd that is down or dropped the connection. Exits missed meanwhile
// are found by provider sync and by the agents' streams dropping.
const eventRetry = 5 * time.Second

// WatchExits implements providers.ExitWatcher: it follows libvirtd's
// domain lifecycle events on a connection of its own, and hands every
// Tether domain that stopped or crashed to f, until ctx ends.
func (p *Provider) WatchExits(ctx context.Context, f func(providers.Exit)) {
	go p.followEvents(ctx, f)
}

var _ providers.ExitWatcher = (*Provider)(nil)

func (p *Provider) followEvents(ctx context.Context, f func(providers.Exit)) {
	for ctx.Err() == nil {
		if err := p.eventsOnce(ctx, f); err != nil && ctx.Err() == nil {
			p.log.Warn("libvirt: following domain events failed; reconnecting (provider sync covers the gap)", "err", err, "retry", eventRetry)
		}
		select {
		case <-ctx.Done():
		case <-p.cfg.Clock.After(eventRetry):
		}
	}
}

// eventsOnce follows one connection's events until it ends.
func (p *Provider) eventsOnce(ctx context.Context, f func(providers.Exit)) error {
	h, err := p.dial(ctx)
	if err != nil {
		return err
	}
	defer h.Close()
	evs, err := h.LifecycleEvents(ctx)
	if err != nil {
		return fmt.Errorf("subscribe to domain lifecycle events: %w", err)
	}
	for ev := range evs {
		if e, ok := exitOf(ev); ok {
			f(e)
		}
	}
	if ctx.Err() == nil {
		return fmt.Errorf("the event stream ended")
	}
	return nil
}

// exitOf turns a lifecycle event of a Tether domain that stopped or
// crashed into an Exit.
func exitOf(ev golibvirt.DomainEventLifecycleMsg) (providers.Exit, bool) {
	id, ok := strings.CutPrefix(ev.Dom.Name, DomainPrefix)
	if !ok || id == "" {
		return providers.Exit{}, false
	}
	var what string
	switch golibvirt.DomainEventType(ev.Event) {
	case golibvirt.DomainEventStopped:
		what = "stopped"
	case golibvirt.DomainEventCrashed:
		what = "crashed"
	default:
		return providers.Exit{}, false
	}
	return providers.Exit{MachineID: id, InstanceID: id,
		Detail: fmt.Sprintf("libvirt domain %s %s (event detail %d)", ev.Dom.Name, what, ev.Detail)}, true
}
