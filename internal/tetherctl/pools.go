package tetherctl

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

func poolStatus(s v1.PoolStatus) string { return enumText(s.String(), "POOL_STATUS_") }

func (a *App) poolTable(ps ...*v1.Pool) func(*tabwriter.Writer) {
	return func(w *tabwriter.Writer) {
		row(w, "NAME", "STATUS", "CLASS", "TARGET", "READY", "WARMING", "CLAIMED", "ERRORED", "DEFICIT", "REPLENISHED")
		for _, p := range ps {
			c := p.Counts
			if c == nil {
				c = &v1.PoolCounts{}
			}
			row(w, p.Name, poolStatus(p.Status), enumText(p.LifecycleClass.String(), "LIFECYCLE_CLASS_"), p.TargetSize,
				c.Ready, c.Warming, c.Claimed, c.Errored, c.Deficit, ago(p.LastReplenishedAt))
		}
	}
}

func (a *App) poolDetail(p *v1.Pool) func(*tabwriter.Writer) {
	return func(w *tabwriter.Writer) {
		a.poolTable(p)(w)
		row(w, "")
		row(w, "template:", p.TemplateName, "provider:", p.Provider, dash(p.Region), dash(p.InstanceType))
		row(w, "size:", fmt.Sprintf("target %d, min %d, max %d", p.TargetSize, p.MinSize, p.MaxSize))
		if m := p.Metadata; m != nil {
			ret := "7 (default)"
			if m.RecordRetentionDays != nil {
				ret = fmt.Sprint(*m.RecordRetentionDays)
			}
			row(w, "timeouts:", fmt.Sprintf("warming %ds, ready ttl %ds, claimed ttl %ds, retention %s days, reuse without reset %v",
				m.WarmingTimeoutSeconds, m.ReadyTtlSeconds, m.ClaimedTtlSeconds, ret, m.ReuseWithoutReset))
		}
		if len(p.Members) > 0 {
			row(w, "")
			row(w, "MEMBER", "NODE", "POOL STATE", "STATUS", "WARMING SINCE", "ACQUIRED")
			for _, m := range p.Members {
				row(w, m.InstanceId, m.NodeName, pstate(m.PoolState), status2(m.Status), when(m.PoolWarmingStartedAt), when(m.PoolAcquiredAt))
			}
		}
	}
}

func parseClass(s string) (v1.LifecycleClass, error) {
	if s == "" {
		return v1.LifecycleClass_LIFECYCLE_CLASS_UNSPECIFIED, nil
	}
	v, ok := v1.LifecycleClass_value["LIFECYCLE_CLASS_"+strings.ToUpper(s)]
	if !ok {
		return 0, fmt.Errorf("--class %q: want ephemeral or spot", s)
	}
	return v1.LifecycleClass(v), nil
}

func (a *App) poolCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "pool", Short: "Warm instance pools"}
	var req v1.CreatePoolRequest
	var class string
	var maxSize int32
	meta := &v1.PoolMetadata{}
	var retention int32
	create := &cobra.Command{Use: "create NAME --template T --provider P --target N [--min N] [--max N] [--class ephemeral|spot]", Short: "Create a pool", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.dial()
			if err != nil {
				return err
			}
			req.Name = args[0]
			if req.LifecycleClass, err = parseClass(class); err != nil {
				return err
			}
			if cmd.Flags().Changed("max") {
				req.MaxSize = &maxSize
			}
			if cmd.Flags().Changed("retention-days") {
				meta.RecordRetentionDays = &retention
			}
			req.Metadata = meta
			ctx, cancel := a.ctx()
			defer cancel()
			p, err := c.CreatePool(ctx, &req)
			if err != nil {
				return err
			}
			return a.print(p, a.poolDetail(p))
		}}
	f := create.Flags()
	f.StringVar(&req.Template, "template", "", "template of the members (required)")
	f.StringVar(&req.Provider, "provider", "", "provider of the members (required)")
	f.StringVar(&req.Region, "region", "", "provider region")
	f.StringVar(&req.InstanceType, "instance-type", "", "provider instance type")
	f.Int32Var(&req.TargetSize, "target", 0, "ready + warming members to keep (required)")
	f.Int32Var(&req.MinSize, "min", 0, "lower bound")
	f.Int32Var(&maxSize, "max", 0, "upper bound on all live members (default target + 10)")
	f.StringVar(&class, "class", "", "ephemeral (default) or spot")
	f.Int32Var(&meta.WarmingTimeoutSeconds, "warming-timeout", 0, "seconds a member may warm before it is replaced (default 600)")
	f.Int32Var(&meta.ReadyTtlSeconds, "ready-ttl", 0, "seconds a ready member lives before it is recycled (default 3600)")
	f.Int32Var(&meta.ClaimedTtlSeconds, "claimed-ttl", 0, "seconds after which a claimed member is flagged stale (default 86400)")
	f.Int32Var(&retention, "retention-days", 0, "days dead member records are kept (default 7, 0 disables pruning)")
	f.BoolVar(&meta.ReuseWithoutReset, "reuse-without-reset", false, "released members go back to ready instead of being recycled")
	f.Int32Var(&meta.ErroredTerminateMaxAttempts, "terminate-attempts", 0, "terminate retries for errored members (default 5)")
	for _, r := range []string{"template", "provider", "target"} {
		_ = create.MarkFlagRequired(r)
	}

	var ureq v1.UpdatePoolRequest
	var uclass string
	umeta := &v1.PoolMetadata{}
	var uret int32
	update := &cobra.Command{Use: "update NAME [--target N] [--min N] [--max N] [--class C] [timeouts...]", Short: "Change a pool", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.dial()
			if err != nil {
				return err
			}
			ureq.Name = args[0]
			fl := cmd.Flags()
			for flag, field := range map[string]string{"target": "target_size", "min": "min_size", "max": "max_size", "class": "lifecycle_class"} {
				if fl.Changed(flag) {
					ureq.UpdateMask = append(ureq.UpdateMask, field)
				}
			}
			// One mask entry per metadata field, so that changing one leaves
			// the others as they are ("metadata" alone replaces them all).
			for _, f := range []struct{ flag, field string }{{"warming-timeout", "warming_timeout_seconds"}, {"ready-ttl", "ready_ttl_seconds"},
				{"claimed-ttl", "claimed_ttl_seconds"}, {"retention-days", "record_retention_days"},
				{"reuse-without-reset", "reuse_without_reset"}, {"terminate-attempts", "errored_terminate_max_attempts"}} {
				if fl.Changed(f.flag) {
					ureq.UpdateMask = append(ureq.UpdateMask, "metadata."+f.field)
				}
			}
			if ureq.LifecycleClass, err = parseClass(uclass); err != nil {
				return err
			}
			if fl.Changed("retention-days") {
				umeta.RecordRetentionDays = &uret
			}
			ureq.Metadata = umeta
			ctx, cancel := a.ctx()
			defer cancel()
			p, err := c.UpdatePool(ctx, &ureq)
			if err != nil {
				return err
			}
			return a.print(p, a.poolDetail(p))
		}}
	uf := update.Flags()
	uf.Int32Var(&ureq.TargetSize, "target", 0, "target size")
	uf.Int32Var(&ureq.MinSize, "min", 0, "min size")
	uf.Int32Var(&ureq.MaxSize, "max", 0, "max size")
	uf.StringVar(&uclass, "class", "", "ephemeral or spot")
	uf.Int32Var(&umeta.WarmingTimeoutSeconds, "warming-timeout", 0, "seconds")
	uf.Int32Var(&umeta.ReadyTtlSeconds, "ready-ttl", 0, "seconds")
	uf.Int32Var(&umeta.ClaimedTtlSeconds, "claimed-ttl", 0, "seconds")
	uf.Int32Var(&uret, "retention-days", 0, "days (0 disables pruning)")
	uf.BoolVar(&umeta.ReuseWithoutReset, "reuse-without-reset", false, "reuse released members")
	uf.Int32Var(&umeta.ErroredTerminateMaxAttempts, "terminate-attempts", 0, "terminate retries for errored members")

	list := &cobra.Command{Use: "list", Short: "List pools with live counts", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error {
		c, err := a.dial()
		if err != nil {
			return err
		}
		ctx, cancel := a.ctx()
		defer cancel()
		resp, err := c.ListPools(ctx, &v1.ListPoolsRequest{PageSize: 1000})
		if err != nil {
			return err
		}
		return a.print(resp, a.poolTable(resp.Pools...))
	}}
	get := &cobra.Command{Use: "get NAME", Short: "Show a pool, its counts and members", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		c, err := a.dial()
		if err != nil {
			return err
		}
		ctx, cancel := a.ctx()
		defer cancel()
		p, err := c.GetPool(ctx, &v1.GetPoolRequest{Name: args[0]})
		if err != nil {
			return err
		}
		return a.print(p, a.poolDetail(p))
	}}
	poolAction := func(use, short string, do func(c v1.AdminServiceClient, name string) (proto.Message, func(*tabwriter.Writer), error)) *cobra.Command {
		return &cobra.Command{Use: use + " NAME", Short: short, Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
			c, err := a.dial()
			if err != nil {
				return err
			}
			msg, table, err := do(c, args[0])
			if err != nil {
				return err
			}
			return a.print(msg, table)
		}}
	}
	pause := poolAction("pause", "Stop replenishing and handing out members", func(c v1.AdminServiceClient, n string) (proto.Message, func(*tabwriter.Writer), error) {
		ctx, cancel := a.ctx()
		defer cancel()
		p, err := c.PausePool(ctx, &v1.PoolActionRequest{Name: n})
		if err != nil {
			return nil, nil, err
		}
		return p, a.poolTable(p), nil
	})
	activate := poolAction("activate", "Resume a paused or drained pool", func(c v1.AdminServiceClient, n string) (proto.Message, func(*tabwriter.Writer), error) {
		ctx, cancel := a.ctx()
		defer cancel()
		p, err := c.ActivatePool(ctx, &v1.PoolActionRequest{Name: n})
		if err != nil {
			return nil, nil, err
		}
		return p, a.poolTable(p), nil
	})
	drain := poolAction("drain", "Terminate every ready member; claimed members run out their work", func(c v1.AdminServiceClient, n string) (proto.Message, func(*tabwriter.Writer), error) {
		ctx, cancel := a.ctx()
		defer cancel()
		r, err := c.DrainPool(ctx, &v1.PoolActionRequest{Name: n})
		if err != nil {
			return nil, nil, err
		}
		return r, func(w *tabwriter.Writer) {
			a.poolTable(r.Pool)(w)
			row(w, "")
			row(w, "drained:", r.Drained, "terminate_failed:", r.TerminateFailed, "claimed_remaining:", r.ClaimedRemaining)
			if len(r.FailedInstanceIds) > 0 {
				row(w, "failed:", strings.Join(r.FailedInstanceIds, ", "))
			}
		}, nil
	})
	del := poolAction("delete", "Delete a pool with no live members", func(c v1.AdminServiceClient, n string) (proto.Message, func(*tabwriter.Writer), error) {
		ctx, cancel := a.ctx()
		defer cancel()
		r, err := c.DeletePool(ctx, &v1.PoolActionRequest{Name: n})
		if err != nil {
			return nil, nil, err
		}
		return r, func(w *tabwriter.Writer) { row(w, "deleted pool", n) }, nil
	})
	replenish := poolAction("replenish", "Provision members up to the target now", func(c v1.AdminServiceClient, n string) (proto.Message, func(*tabwriter.Writer), error) {
		ctx, cancel := a.ctx()
		defer cancel()
		r, err := c.ReplenishPool(ctx, &v1.PoolActionRequest{Name: n})
		if err != nil {
			return nil, nil, err
		}
		return r, func(w *tabwriter.Writer) {
			a.poolTable(r.Pool)(w)
			row(w, "")
			row(w, "provisioned:", r.Provisioned, "provision_failed:", r.ProvisionFailed)
		}, nil
	})
	recycle := poolAction("recycle", "Run the reaper's recycle phase now", func(c v1.AdminServiceClient, n string) (proto.Message, func(*tabwriter.Writer), error) {
		ctx, cancel := a.ctx()
		defer cancel()
		r, err := c.RecyclePool(ctx, &v1.PoolActionRequest{Name: n})
		if err != nil {
			return nil, nil, err
		}
		return r, func(w *tabwriter.Writer) {
			a.poolTable(r.Pool)(w)
			row(w, "")
			row(w, "recycled:", r.Recycled, "replaced:", r.Replaced, "flagged:", r.Flagged, "retried:", r.Retried,
				"abandoned:", r.Abandoned, "pruned:", r.Pruned, "terminate_failed:", r.TerminateFailed)
		}, nil
	})

	var areq v1.AcquirePoolMemberRequest
	var aclass string
	acquire := &cobra.Command{Use: "acquire [NAME] [--by WHO] [--for WHAT]", Short: "Claim the oldest ready member", Args: cobra.MaximumNArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			c, err := a.dial()
			if err != nil {
				return err
			}
			if len(args) == 1 {
				areq.PoolName = args[0]
			}
			if areq.LifecycleClass, err = parseClass(aclass); err != nil {
				return err
			}
			ctx, cancel := a.ctx()
			defer cancel()
			r, err := c.AcquirePoolMember(ctx, &areq)
			if err != nil {
				return err
			}
			return a.print(r, func(w *tabwriter.Writer) {
				row(w, "claim:", r.ClaimId)
				row(w, "pool:", r.PoolName)
				row(w, "instance:", r.Instance.Id)
				row(w, "node:", r.Instance.NodeName)
				row(w, "addresses:", dash(strings.Join(r.Instance.Addresses, ", ")))
			})
		}}
	acquire.Flags().StringVar(&areq.PoolId, "pool-id", "", "pool id (wins over NAME)")
	acquire.Flags().StringVar(&aclass, "class", "", "any active pool of this class")
	acquire.Flags().StringVar(&areq.AcquiredBy, "by", "", "who claims (recorded on the claim)")
	acquire.Flags().StringVar(&areq.AcquiredFor, "for", "", "what for (recorded on the claim)")
	release := &cobra.Command{Use: "release INSTANCE_ID", Short: "Return a claimed member to its pool", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		c, err := a.dial()
		if err != nil {
			return err
		}
		ctx, cancel := a.ctx()
		defer cancel()
		r, err := c.ReleasePoolMember(ctx, &v1.ReleasePoolMemberRequest{InstanceId: args[0]})
		if err != nil {
			return err
		}
		return a.print(r, func(w *tabwriter.Writer) {
			row(w, "disposition:", r.Disposition)
			row(w, "claim:", r.ClaimId)
			row(w, "held:", fmt.Sprintf("%ds", r.HeldSeconds))
			if r.Disposition == "errored" && r.Instance != nil {
				// The member is parked errored; its machine may still run.
				row(w, "error:", r.Instance.ErrorMessage)
			}
		})
	}}
	cmd.AddCommand(create, update, list, get, pause, activate, drain, del, replenish, recycle, acquire, release)
	return cmd
}
