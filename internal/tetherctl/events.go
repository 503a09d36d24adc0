package tetherctl

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

func eventRow(w io.Writer, e *v1.FleetEvent) {
	row(w, when(e.CreatedAt), enumText(e.Severity.String(), "SEVERITY_"), e.Kind, dash(e.InstanceId), dash(e.CorrelationId), oneLine(e.Message, 100))
}

func (a *App) eventsCmd() *cobra.Command {
	var req v1.ListEventsRequest
	var watch bool
	var pg paging
	cmd := &cobra.Command{Use: "events [--kind K] [--instance ID] [--pool P] [--correlation C] [--watch]", Short: "Read the fleet event log, newest first", Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if req.PoolId != "" {
				// Accept a pool name as well as an id; a name that is not a
				// pool is taken as an id.
				if p, err := invoke(a, v1.AdminServiceClient.GetPool, &v1.GetPoolRequest{Name: req.PoolId}); err == nil {
					req.PoolId = p.Id
				}
			}
			if watch {
				return a.watchEvents(&req)
			}
			return list(a, v1.AdminServiceClient.ListEvents, &req, pg, func(w *tabwriter.Writer, r *v1.ListEventsResponse) {
				row(w, "TIME", "SEVERITY", "KIND", "INSTANCE", "CORRELATION", "MESSAGE")
				for _, e := range r.Events {
					eventRow(w, e)
				}
			})
		}}
	f := cmd.Flags()
	f.StringVar(&req.Kind, "kind", "", "only this kind (e.g. pool.released)")
	f.StringVar(&req.InstanceId, "instance", "", "only this instance")
	f.StringVar(&req.PoolId, "pool", "", "only this pool (name or id)")
	f.StringVar(&req.CorrelationId, "correlation", "", "only this correlation id (claim id, task id)")
	f.BoolVar(&watch, "watch", false, "stream new events as they happen")
	pg.flags(f, 100, "events, newest first")
	return cmd
}

// watchEvents streams events until the user interrupts.
func (a *App) watchEvents(req *v1.ListEventsRequest) error {
	c, err := a.dial()
	if err != nil {
		return err
	}
	stream, err := c.WatchEvents(a.base, &v1.WatchEventsRequest{Kind: req.Kind, InstanceId: req.InstanceId,
		PoolId: req.PoolId, CorrelationId: req.CorrelationId, MinSeverity: req.MinSeverity})
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(a.Stdout, 0, 4, 2, ' ', 0)
	for {
		e, err := stream.Recv()
		if err != nil {
			return err
		}
		if a.Output == "json" {
			b, err := jsonOut.Marshal(e)
			if err != nil {
				return fmt.Errorf("encode event as JSON: %w", err)
			}
			fmt.Fprintln(a.Stdout, string(b))
			continue
		}
		eventRow(w, e)
		w.Flush()
	}
}
