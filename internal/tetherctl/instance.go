package tetherctl

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

func instanceStatus(s v1.InstanceStatus) string { return enumText(s.String(), "INSTANCE_STATUS_") }
func agentPhase(p v1.AgentPhase) string         { return enumText(p.String(), "AGENT_PHASE_") }
func poolState(p v1.PoolState) string           { return enumText(p.String(), "POOL_STATE_") }

func instanceTable(w *tabwriter.Writer, ins []*v1.Instance) {
	row(w, "ID", "NODE", "STATUS", "PHASE", "PROVIDER", "POOL STATE", "HEARTBEAT", "AGENT", "ERROR")
	for _, in := range ins {
		errText := in.ErrorMessage
		if errText == "" {
			errText = in.AgentError
		}
		row(w, in.Id, in.NodeName, instanceStatus(in.Status), agentPhase(in.AgentPhase), in.Provider, poolState(in.PoolState),
			ago(in.LastHeartbeatAt), presenceText(in.AgentPresence), dash(oneLine(errText, 60)))
	}
}

// presenceText says whether a replica holds the agent's stream: "connected
// to replica X", "lost 12s ago", or "never connected" (design §2.10).
func presenceText(p *v1.AgentPresence) string {
	switch {
	case p == nil:
		return "never connected"
	case p.Connected:
		return "connected to replica " + p.Replica
	case p.LostAt != nil:
		return "lost " + ago(p.LostAt)
	}
	return "not connected"
}

func instanceDetail(w *tabwriter.Writer, in *v1.Instance) {
	row(w, "id:", in.Id)
	row(w, "node:", in.NodeName)
	row(w, "status:", instanceStatus(in.Status))
	row(w, "provider:", in.Provider, dash(in.Region), dash(in.InstanceType))
	row(w, "machine:", dash(in.CloudInstanceId))
	row(w, "agent:", agentPhase(in.AgentPhase), dash(in.AgentVersion))
	row(w, "last heartbeat:", when(in.LastHeartbeatAt), "("+ago(in.LastHeartbeatAt)+")")
	row(w, "agent stream:", presenceText(in.AgentPresence))
	row(w, "addresses:", dash(strings.Join(in.Addresses, ", ")))
	row(w, "modules:", dash(strings.Join(in.RunningModuleDigests, ", ")))
	if in.TpmEkHash != "" {
		row(w, "TPM EK:", in.TpmEkHash)
	}
	if in.ModuleRamBytes > 0 {
		row(w, "module RAM:", fmt.Sprintf("%.1f MiB", float64(in.ModuleRamBytes)/(1<<20)))
	}
	if in.PoolId != "" {
		row(w, "pool:", in.PoolId, poolState(in.PoolState), dash(in.ClaimId))
	}
	if in.Hold {
		row(w, "hold:", in.HoldReason)
	}
	if c := in.Cordon; c != nil {
		row(w, "cordon:", c.Reason, "by "+c.By, when(c.At))
	}
	if in.ErrorMessage != "" {
		row(w, "error:", in.ErrorMessage)
	}
	if in.AgentError != "" {
		row(w, "agent error:", in.AgentError)
	}
	row(w, "created:", when(in.CreatedAt))
}

// withState renders an instance followed by one "label: state" line.
func withState[T interface{ GetInstance() *v1.Instance }](label string, state func(T) string) func(*tabwriter.Writer, T) {
	return func(w *tabwriter.Writer, r T) {
		instanceTable(w, []*v1.Instance{r.GetInstance()})
		row(w, "")
		row(w, label, state(r))
	}
}

func (a *App) instanceCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "instance", Short: "Provision and drive instances"}
	var provisionReq v1.ProvisionInstanceRequest
	provision := &cobra.Command{Use: "provision --node NAME --provider qemu|external [--operation-id ID]", Short: "Create an instance of a node", Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return call(a, v1.AdminServiceClient.ProvisionInstance, &provisionReq, func(w *tabwriter.Writer, resp *v1.ProvisionInstanceResponse) {
				instanceTable(w, []*v1.Instance{resp.Instance})
				if resp.Existing {
					row(w, "")
					row(w, "(an earlier call with this operation id created it)")
				}
				if resp.BootstrapToken != "" {
					row(w, "")
					row(w, "Boot the machine with this enrollment data (the token is shown once):")
					row(w, "  tether.url="+resp.ControlPlaneUrl, "tether.token="+resp.BootstrapToken, "tether.ca="+resp.CaFingerprint)
				} else if resp.Instance.GetProvider() == "external" && !resp.Existing {
					// A node with a TPM bound gets no token (design §3.9).
					row(w, "")
					row(w, "Boot the machine with this enrollment data (no token: its TPM proves it):")
					row(w, "  tether.url="+resp.ControlPlaneUrl, "tether.instance="+resp.Instance.GetId(), "tether.ca="+resp.CaFingerprint)
				}
			})
		}}
	pf := provision.Flags()
	pf.StringVar(&provisionReq.Node, "node", "", "node to provision (required)")
	pf.StringVar(&provisionReq.Provider, "provider", "", "qemu, external or another configured provider (required)")
	pf.StringVar(&provisionReq.Region, "region", "", "provider region")
	pf.StringVar(&provisionReq.InstanceType, "instance-type", "", "provider instance type")
	pf.StringVar(&provisionReq.OperationId, "operation-id", "", "idempotency key: a retry with the same id returns the same instance")
	_ = provision.MarkFlagRequired("node")
	_ = provision.MarkFlagRequired("provider")

	var listReq v1.ListInstancesRequest
	var listStatus string
	var pg paging
	listCmd := &cobra.Command{Use: "list", Short: "List instances", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error {
		var err error
		listReq.Status, err = parseEnum[v1.InstanceStatus]("status", listStatus, "INSTANCE_STATUS_", v1.InstanceStatus_value,
			"an instance status (provisioning, booting, running, stopped, error, terminated, ...)")
		if err != nil {
			return err
		}
		return list(a, v1.AdminServiceClient.ListInstances, &listReq, pg,
			func(w *tabwriter.Writer, r *v1.ListInstancesResponse) { instanceTable(w, r.Instances) })
	}}
	listCmd.Flags().StringVar(&listReq.Node, "node", "", "only this node's instances")
	listCmd.Flags().StringVar(&listReq.Pool, "pool", "", "only this pool's members")
	listCmd.Flags().StringVar(&listStatus, "status", "", "only this status")
	pg.flags(listCmd.Flags(), 0, "instances")

	get := &cobra.Command{Use: "get ID", Short: "Show an instance", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		return call(a, v1.AdminServiceClient.GetInstance, &v1.GetInstanceRequest{Id: args[0]}, instanceDetail)
	}}
	cmd.AddCommand(provision, listCmd, get)

	action := func(use, short string, method rpc[*v1.InstanceActionRequest, *v1.Instance]) *cobra.Command {
		return &cobra.Command{Use: use + " ID", Short: short, Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
			return call(a, method, &v1.InstanceActionRequest{Id: args[0]}, one(instanceTable))
		}}
	}
	cmd.AddCommand(
		action("start", "Start a stopped instance", v1.AdminServiceClient.StartInstance),
		action("stop", "Stop a running instance", v1.AdminServiceClient.StopInstance),
		action("reboot", "Reboot a running instance", v1.AdminServiceClient.RebootInstance),
		action("terminate", "Destroy an instance's machine and revoke its identity", v1.AdminServiceClient.TerminateInstance),
		action("unhold", "Clear an operator hold", v1.AdminServiceClient.UnholdInstance),
	)

	var holdReason string
	hold := &cobra.Command{Use: "hold ID --reason R", Short: "Refuse start, reboot and terminate until unhold", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		return call(a, v1.AdminServiceClient.HoldInstance, &v1.HoldInstanceRequest{Id: args[0], Reason: holdReason}, one(instanceTable))
	}}
	hold.Flags().StringVar(&holdReason, "reason", "", "why (required)")
	_ = hold.MarkFlagRequired("reason")

	cordonState := withState("cordon:", (*v1.CordonInstanceResponse).GetCordonState)
	var cordonReason string
	cordon := &cobra.Command{Use: "cordon ID --reason R", Short: "Mark an instance unschedulable", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		return call(a, v1.AdminServiceClient.CordonInstance, &v1.CordonInstanceRequest{Id: args[0], Reason: cordonReason}, cordonState)
	}}
	cordon.Flags().StringVar(&cordonReason, "reason", "", "why (required)")
	_ = cordon.MarkFlagRequired("reason")
	uncordon := &cobra.Command{Use: "uncordon ID", Short: "Clear a cordon", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		return call(a, v1.AdminServiceClient.UncordonInstance, &v1.InstanceActionRequest{Id: args[0]},
			withState("uncordon:", (*v1.UncordonInstanceResponse).GetUncordonState))
	}}
	var drainReason string
	drain := &cobra.Command{Use: "drain ID", Short: "Cordon, then stop", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		return call(a, v1.AdminServiceClient.DrainInstance, &v1.DrainInstanceRequest{Id: args[0], Reason: drainReason},
			withState("cordon:", (*v1.DrainInstanceResponse).GetCordonState))
	}}
	drain.Flags().StringVar(&drainReason, "reason", "drained by operator", "why")

	var follow bool
	var tail int64
	console := &cobra.Command{Use: "console ID", Short: "Show a qemu or libvirt instance's serial console log", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		c, err := a.dial()
		if err != nil {
			return err
		}
		// No deadline: --follow runs until the user interrupts.
		stream, err := c.GetInstanceConsole(a.base, &v1.GetInstanceConsoleRequest{Id: args[0], Follow: follow, TailBytes: tail})
		if err != nil {
			return err
		}
		for {
			chunk, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
			// The serial console is a terminal's own output, shown as is.
			if _, err := a.Stdout.Write(chunk.Data); err != nil {
				return err
			}
		}
	}}
	console.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new output")
	console.Flags().Int64Var(&tail, "tail", 0, "only the last N bytes")

	var isoFile string
	seed := &cobra.Command{Use: "seed-iso ID -o FILE", Short: "Write a seed ISO (TETHERSEED) with fresh enrollment data", Args: cobra.ExactArgs(1),
		// Here -o names the ISO file (docs/design.md §9.3), so the global check of -o
		// as an output format does not apply.
		PersistentPreRunE: func(*cobra.Command, []string) error { return nil },
		RunE: func(_ *cobra.Command, args []string) error {
			if isoFile == "" && a.Output != "table" && a.Output != "json" {
				isoFile, a.Output = a.Output, "table"
			}
			if isoFile == "" {
				return errors.New("seed-iso: -o FILE is required")
			}
			resp, err := invoke(a, v1.AdminServiceClient.CreateSeedISO, &v1.CreateSeedISORequest{Id: args[0]})
			if err != nil {
				return err
			}
			if err := os.WriteFile(isoFile, resp.Iso, 0o600); err != nil {
				return err
			}
			fmt.Fprintf(a.Stderr, "wrote %s (%s); it holds a one-time token: keep it private\n", isoFile, humanBytes(int64(len(resp.Iso))))
			return nil
		}}
	seed.Flags().StringVar(&isoFile, "file", "", "where to write the ISO (same as -o FILE)")
	var waitFor time.Duration
	wait := &cobra.Command{Use: "wait ID", Short: "Print each status and boot phase until the instance is running (or fails)", Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			return a.waitRunning(args[0], waitFor)
		}}
	wait.Flags().DurationVar(&waitFor, "for", 5*time.Minute, "give up after this long")
	cmd.AddCommand(hold, cordon, uncordon, drain, console, seed, wait)
	return cmd
}

// pollEvery is how often the wait loops ask again.
const pollEvery = 200 * time.Millisecond

// waitRunning polls the instance and prints every change of status, phase
// or error until it is running with a ready agent. An interrupt ends it
// at once.
func (a *App) waitRunning(id string, limit time.Duration) error {
	start := time.Now()
	last := ""
	for {
		in, err := invoke(a, v1.AdminServiceClient.GetInstance, &v1.GetInstanceRequest{Id: id})
		if err != nil {
			return err
		}
		errText := in.AgentError
		if errText == "" {
			errText = in.ErrorMessage
		}
		line := printable(fmt.Sprintf("%-12s %-12s %s", instanceStatus(in.Status), agentPhase(in.AgentPhase), errText))
		if line != last {
			fmt.Fprintf(a.Stdout, "%7.2fs  %s\n", time.Since(start).Seconds(), strings.TrimSpace(line))
			last = line
		}
		switch {
		case in.Status == v1.InstanceStatus_INSTANCE_STATUS_RUNNING && in.AgentPhase == v1.AgentPhase_AGENT_PHASE_READY:
			return nil
		case in.Status == v1.InstanceStatus_INSTANCE_STATUS_ERROR, in.Status == v1.InstanceStatus_INSTANCE_STATUS_TERMINATED:
			return fmt.Errorf("instance %s is %s: %s (see tetherctl instance console %s)", id, instanceStatus(in.Status), printable(errText), id)
		case time.Since(start) > limit:
			return fmt.Errorf("instance %s is still %s after %s (see tetherctl instance console %s)", id, strings.TrimSpace(line), limit, id)
		}
		if err := sleep(a.base, pollEvery); err != nil {
			return err
		}
	}
}
