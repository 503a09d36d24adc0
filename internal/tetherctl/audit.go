package tetherctl

import (
	"context"
	"fmt"
	"os/signal"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// auditPoll is how often --watch asks for new records.
const auditPoll = 2 * time.Second

// parseSince takes an RFC 3339 time or a duration back from now ("24h").
func parseSince(s string, now time.Time) (*timestamppb.Timestamp, error) {
	if s == "" {
		return nil, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		return timestamppb.New(now.Add(-d)), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return nil, fmt.Errorf("--since %q: want an RFC 3339 time (2026-01-02T15:04:05Z) or a duration (24h)", s)
	}
	return timestamppb.New(t), nil
}

func (a *App) auditCmd() *cobra.Command {
	var ident, since string
	var watch bool
	cmd := &cobra.Command{
		Use: "audit [--identity NAME] [--since T] [--watch]", Short: "Read the audit trail: who did what, to what, with which result (admin; reading it is audited too)", Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			from, err := parseSince(since, time.Now())
			if err != nil {
				return err
			}
			c, err := a.dial()
			if err != nil {
				return err
			}
			req := &v1.ListAuditRequest{Identity: ident, Since: from, PageSize: 1000}
			var all []*v1.AuditRecord
			fetch := func(ctx context.Context) ([]*v1.AuditRecord, error) {
				var got []*v1.AuditRecord
				for {
					resp, err := c.ListAudit(ctx, req)
					if err != nil {
						return got, err
					}
					got = append(got, resp.Records...)
					if len(resp.Records) == 0 {
						return got, nil
					}
					req.AfterId = resp.Records[len(resp.Records)-1].Id
					if len(resp.Records) < int(req.PageSize) {
						return got, nil
					}
				}
			}
			ctx, cancel := a.ctx()
			all, err = fetch(ctx)
			cancel()
			if err != nil {
				return err
			}
			if !watch {
				return a.print(&v1.ListAuditResponse{Records: all}, auditTable(true, all...))
			}
			if err := a.print(&v1.ListAuditResponse{Records: all}, auditTable(true, all...)); err != nil {
				return err
			}
			sig, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			tick := time.NewTicker(auditPoll)
			defer tick.Stop()
			for {
				select {
				case <-sig.Done():
					return nil
				case <-tick.C:
				}
				ctx, cancel := context.WithTimeout(sig, a.Timeout)
				recs, err := fetch(ctx)
				cancel()
				if err != nil && sig.Err() == nil {
					return err
				}
				if len(recs) > 0 {
					if err := a.print(&v1.ListAuditResponse{Records: recs}, auditTable(false, recs...)); err != nil {
						return err
					}
				}
			}
		},
	}
	cmd.Flags().StringVar(&ident, "identity", "", "only this identity's records")
	cmd.Flags().StringVar(&since, "since", "", "only records since this time (RFC 3339) or this long ago (24h)")
	cmd.Flags().BoolVar(&watch, "watch", false, "keep printing new records until interrupted")
	return cmd
}

func auditTable(header bool, rs ...*v1.AuditRecord) func(*tabwriter.Writer) {
	return func(w *tabwriter.Writer) {
		if header {
			row(w, "TIME", "IDENTITY", "ROLE", "SERIAL", "METHOD", "TARGET", "RESULT")
		}
		for _, r := range rs {
			row(w, when(r.At), r.Identity, r.Role, r.Serial, r.Method, dash(r.Target), r.Code)
		}
	}
}
