package tetherctl

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

func poolStatus(s v1.PoolStatus) string { return enumText(s.String(), "POOL_STATUS_") }

func poolTable(w *tabwriter.Writer, ps []*v1.Pool) {
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

func poolDetail(w *tabwriter.Writer, p *v1.Pool) {
	poolTable(w, []*v1.Pool{p})
	row(w, "")
	row(w, "template:", p.TemplateName, "provider:", p.Provider, dash(p.Region), dash(p.InstanceType))
	row(w, "size:", fmt.Sprintf("target %d, min %d, max %d", p.TargetSize, p.MinSize, p.MaxSize))
	if m := p.Metadata; m != nil {
		retention := "7 (default)"
		if m.RecordRetentionDays != nil {
			retention = fmt.Sprint(*m.RecordRetentionDays)
		}
		row(w, "timeouts:", fmt.Sprintf("warming %ds, ready ttl %ds, claimed ttl %ds, retention %s days, reuse without reset %v",
			m.WarmingTimeoutSeconds, m.ReadyTtlSeconds, m.ClaimedTtlSeconds, retention, m.ReuseWithoutReset))
	}
	if len(p.Members) > 0 {
		row(w, "")
		row(w, "MEMBER", "NODE", "POOL STATE", "STATUS", "WARMING SINCE", "ACQUIRED")
		for _, m := range p.Members {
			row(w, m.InstanceId, m.NodeName, poolState(m.PoolState), instanceStatus(m.Status), when(m.PoolWarmingStartedAt), when(m.PoolAcquiredAt))
		}
	}
}

// withPool renders a pool action's pool followed by its own lines.
func withPool[T interface{ GetPool() *v1.Pool }](more func(*tabwriter.Writer, T)) func(*tabwriter.Writer, T) {
	return func(w *tabwriter.Writer, r T) {
		poolTable(w, []*v1.Pool{r.GetPool()})
		row(w, "")
		more(w, r)
	}
}

func parseClass(s string) (v1.LifecycleClass, error) {
	return parseEnum[v1.LifecycleClass]("class", s, "LIFECYCLE_CLASS_", v1.LifecycleClass_value, "ephemeral or spot")
}

// poolMetaFlags are the timeouts and retention of pool create and update.
func poolMetaFlags(f *pflag.FlagSet, meta *v1.PoolMetadata, retention *int32) {
	f.Int32Var(&meta.WarmingTimeoutSeconds, "warming-timeout", 0, "seconds a member may warm before it is replaced (default 600)")
	f.Int32Var(&meta.ReadyTtlSeconds, "ready-ttl", 0, "seconds a ready member lives before it is recycled (default 3600)")
	f.Int32Var(&meta.ClaimedTtlSeconds, "claimed-ttl", 0, "seconds after which a claimed member is flagged stale (default 86400)")
	f.Int32Var(retention, "retention-days", 0, "days dead member records are kept (default 7, 0 disables pruning)")
	f.BoolVar(&meta.ReuseWithoutReset, "reuse-without-reset", false, "released members go back to ready instead of being recycled")
	f.Int32Var(&meta.ErroredTerminateMaxAttempts, "terminate-attempts", 0, "terminate retries for errored members (default 5)")
}

func (a *App) poolCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "pool", Short: "Warm instance pools"}
	var createReq v1.CreatePoolRequest
	var createClass string
	var createMax int32
	createMeta := &v1.PoolMetadata{}
	var createRetention int32
	create := &cobra.Command{Use: "create NAME --template T --provider P --target N [--min N] [--max N] [--class ephemeral|spot]", Short: "Create a pool", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			createReq.Name = args[0]
			if createReq.LifecycleClass, err = parseClass(createClass); err != nil {
				return err
			}
			if cmd.Flags().Changed("max") {
				createReq.MaxSize = &createMax
			}
			if cmd.Flags().Changed("retention-days") {
				createMeta.RecordRetentionDays = &createRetention
			}
			createReq.Metadata = createMeta
			return call(a, v1.AdminServiceClient.CreatePool, &createReq, poolDetail)
		}}
	f := create.Flags()
	f.StringVar(&createReq.Template, "template", "", "template of the members (required)")
	f.StringVar(&createReq.Provider, "provider", "", "provider of the members (required)")
	f.StringVar(&createReq.Region, "region", "", "provider region")
	f.StringVar(&createReq.InstanceType, "instance-type", "", "provider instance type")
	f.Int32Var(&createReq.TargetSize, "target", 0, "ready + warming members to keep (required)")
	f.Int32Var(&createReq.MinSize, "min", 0, "lower bound")
	f.Int32Var(&createMax, "max", 0, "upper bound on all live members (default target + 10)")
	f.StringVar(&createClass, "class", "", "ephemeral (default) or spot")
	poolMetaFlags(f, createMeta, &createRetention)
	for _, r := range []string{"template", "provider", "target"} {
		_ = create.MarkFlagRequired(r)
	}

	var updateReq v1.UpdatePoolRequest
	var updateClass string
	updateMeta := &v1.PoolMetadata{}
	var updateRetention int32
	update := &cobra.Command{Use: "update NAME [--target N] [--min N] [--max N] [--class C] [timeouts...]", Short: "Change a pool", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			updateReq.Name = args[0]
			fl := cmd.Flags()
			for flag, field := range map[string]string{"target": "target_size", "min": "min_size", "max": "max_size", "class": "lifecycle_class"} {
				if fl.Changed(flag) {
					updateReq.UpdateMask = append(updateReq.UpdateMask, field)
				}
			}
			// One mask entry per metadata field, so that changing one leaves
			// the others as they are ("metadata" alone replaces them all).
			for _, f := range []struct{ flag, field string }{{"warming-timeout", "warming_timeout_seconds"}, {"ready-ttl", "ready_ttl_seconds"},
				{"claimed-ttl", "claimed_ttl_seconds"}, {"retention-days", "record_retention_days"},
				{"reuse-without-reset", "reuse_without_reset"}, {"terminate-attempts", "errored_terminate_max_attempts"}} {
				if fl.Changed(f.flag) {
					updateReq.UpdateMask = append(updateReq.UpdateMask, "metadata."+f.field)
				}
			}
			if updateReq.LifecycleClass, err = parseClass(updateClass); err != nil {
				return err
			}
			if fl.Changed("retention-days") {
				updateMeta.RecordRetentionDays = &updateRetention
			}
			updateReq.Metadata = updateMeta
			return call(a, v1.AdminServiceClient.UpdatePool, &updateReq, poolDetail)
		}}
	uf := update.Flags()
	uf.Int32Var(&updateReq.TargetSize, "target", 0, "target size")
	uf.Int32Var(&updateReq.MinSize, "min", 0, "min size")
	uf.Int32Var(&updateReq.MaxSize, "max", 0, "max size")
	uf.StringVar(&updateClass, "class", "", "ephemeral or spot")
	poolMetaFlags(uf, updateMeta, &updateRetention)

	var pg paging
	listCmd := &cobra.Command{Use: "list", Short: "List pools with live counts", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error {
		return list(a, v1.AdminServiceClient.ListPools, &v1.ListPoolsRequest{}, pg, func(w *tabwriter.Writer, r *v1.ListPoolsResponse) { poolTable(w, r.Pools) })
	}}
	pg.flags(listCmd.Flags(), 0, "pools")
	get := &cobra.Command{Use: "get NAME", Short: "Show a pool, its counts and members", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		return call(a, v1.AdminServiceClient.GetPool, &v1.GetPoolRequest{Name: args[0]}, poolDetail)
	}}
	// action is a pool command NAME over PoolActionRequest.
	action := func(use, short string, run func(name string) error) *cobra.Command {
		return &cobra.Command{Use: use + " NAME", Short: short, Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
			return run(args[0])
		}}
	}
	req := func(name string) *v1.PoolActionRequest { return &v1.PoolActionRequest{Name: name} }
	pause := action("pause", "Stop replenishing and handing out members", func(n string) error {
		return call(a, v1.AdminServiceClient.PausePool, req(n), one(poolTable))
	})
	activate := action("activate", "Resume a paused or drained pool", func(n string) error {
		return call(a, v1.AdminServiceClient.ActivatePool, req(n), one(poolTable))
	})
	drain := action("drain", "Terminate every ready member; claimed members run out their work", func(n string) error {
		return call(a, v1.AdminServiceClient.DrainPool, req(n), withPool(func(w *tabwriter.Writer, r *v1.DrainPoolResponse) {
			row(w, "drained:", r.Drained, "terminate_failed:", r.TerminateFailed, "claimed_remaining:", r.ClaimedRemaining)
			if len(r.FailedInstanceIds) > 0 {
				row(w, "failed:", strings.Join(r.FailedInstanceIds, ", "))
			}
		}))
	})
	del := action("delete", "Delete a pool with no live members", func(n string) error {
		return call(a, v1.AdminServiceClient.DeletePool, req(n), deleted[*v1.DeletePoolResponse]("pool", n))
	})
	replenish := action("replenish", "Provision members up to the target now", func(n string) error {
		return call(a, v1.AdminServiceClient.ReplenishPool, req(n), withPool(func(w *tabwriter.Writer, r *v1.ReplenishPoolResponse) {
			row(w, "provisioned:", r.Provisioned, "provision_failed:", r.ProvisionFailed)
		}))
	})
	recycle := action("recycle", "Run the reaper's recycle phase now", func(n string) error {
		return call(a, v1.AdminServiceClient.RecyclePool, req(n), withPool(func(w *tabwriter.Writer, r *v1.RecyclePoolResponse) {
			row(w, "recycled:", r.Recycled, "replaced:", r.Replaced, "flagged:", r.Flagged, "retried:", r.Retried,
				"abandoned:", r.Abandoned, "pruned:", r.Pruned, "terminate_failed:", r.TerminateFailed)
		}))
	})

	var acquireReq v1.AcquirePoolMemberRequest
	var acquireClass string
	acquire := &cobra.Command{Use: "acquire [NAME] [--by WHO] [--for WHAT]", Short: "Claim the oldest ready member", Args: cobra.MaximumNArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			var err error
			if len(args) == 1 {
				acquireReq.PoolName = args[0]
			}
			if acquireReq.LifecycleClass, err = parseClass(acquireClass); err != nil {
				return err
			}
			return call(a, v1.AdminServiceClient.AcquirePoolMember, &acquireReq, func(w *tabwriter.Writer, r *v1.AcquirePoolMemberResponse) {
				row(w, "claim:", r.ClaimId)
				row(w, "pool:", r.PoolName)
				row(w, "instance:", r.Instance.Id)
				row(w, "node:", r.Instance.NodeName)
				row(w, "addresses:", dash(strings.Join(r.Instance.Addresses, ", ")))
			})
		}}
	acquire.Flags().StringVar(&acquireReq.PoolId, "pool-id", "", "pool id (wins over NAME)")
	acquire.Flags().StringVar(&acquireClass, "class", "", "any active pool of this class")
	acquire.Flags().StringVar(&acquireReq.AcquiredBy, "by", "", "who claims (recorded on the claim)")
	acquire.Flags().StringVar(&acquireReq.AcquiredFor, "for", "", "what for (recorded on the claim)")
	release := &cobra.Command{Use: "release INSTANCE_ID", Short: "Return a claimed member to its pool", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		return call(a, v1.AdminServiceClient.ReleasePoolMember, &v1.ReleasePoolMemberRequest{InstanceId: args[0]}, func(w *tabwriter.Writer, r *v1.ReleasePoolMemberResponse) {
			row(w, "disposition:", r.Disposition)
			row(w, "claim:", r.ClaimId)
			row(w, "held:", fmt.Sprintf("%ds", r.HeldSeconds))
			if r.Disposition == "errored" && r.Instance != nil {
				// The member is parked errored; its machine may still run.
				row(w, "error:", r.Instance.ErrorMessage)
			}
		})
	}}
	cmd.AddCommand(create, update, listCmd, get, pause, activate, drain, del, replenish, recycle, acquire, release)
	return cmd
}
