// Package events serves the fleet event log's RPCs of AdminService: a
// page of events, and a watch of new ones. controlplane/events writes
// and follows the log; these handlers check the filter's shape and
// convert.
package events

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/tetherfleet/tether/controlplane/api/admin/adminkit"
	"github.com/tetherfleet/tether/controlplane/api/protoconv"
	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// Config is what the event RPCs use.
type Config struct {
	// Store is read, and followed by its notifications (required).
	Store store.Store
}

// Server serves the event RPCs.
type Server struct {
	cfg Config
}

// New builds the event RPCs, naming a missing dependency.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil {
		return nil, errors.New("events: Config.Store is required")
	}
	return &Server{cfg: cfg}, nil
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
	return store.EventFilter{Kind: store.EventKind(kind), InstanceID: store.InstanceID(instance), PoolID: store.PoolID(pool), CorrelationID: store.CorrelationID(corr), MinSeverity: min}, nil
}

// ListEvents implements AdminService.
func (a *Server) ListEvents(ctx context.Context, req *v1.ListEventsRequest) (*v1.ListEventsResponse, error) {
	p, err := adminkit.Page(req.PageSize, req.PageToken)
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
	evs, err := a.cfg.Store.ListEvents(ctx, f, p)
	if err != nil {
		return nil, err
	}
	out := &v1.ListEventsResponse{}
	if out.Events, out.NextPageToken, err = adminkit.Fill(evs, p.Limit,
		func(e *store.Event) (*v1.FleetEvent, error) { return adminkit.EventProto(e), nil },
		func(e *store.Event) string { return strconv.FormatInt(e.ID, 10) }); err != nil {
		return nil, err
	}
	return out, nil
}

// WatchEvents streams new events from now on.
func (a *Server) WatchEvents(req *v1.WatchEventsRequest, stream v1.AdminService_WatchEventsServer) error {
	f, err := eventFilter(req.Kind, req.InstanceId, req.PoolId, req.CorrelationId, req.MinSeverity)
	if err != nil {
		return err
	}
	ctx := stream.Context()
	from, err := a.cfg.Store.LatestEventID(ctx)
	if err != nil {
		return err
	}
	err = events.Watch(ctx, a.cfg.Store, f, from, 2*time.Second, func(e *store.Event) error { return stream.Send(adminkit.EventProto(e)) })
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
