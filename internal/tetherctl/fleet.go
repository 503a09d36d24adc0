package tetherctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

func contextBackground() context.Context { return context.Background() }

func status2(s v1.InstanceStatus) string { return enumText(s.String(), "INSTANCE_STATUS_") }
func phase(p v1.AgentPhase) string       { return enumText(p.String(), "AGENT_PHASE_") }
func pstate(p v1.PoolState) string       { return enumText(p.String(), "POOL_STATE_") }

func (a *App) instanceTable(ins ...*v1.Instance) func(*tabwriter.Writer) {
	return func(w *tabwriter.Writer) {
		row(w, "ID", "NODE", "STATUS", "PHASE", "PROVIDER", "POOL STATE", "HEARTBEAT", "ERROR")
		for _, in := range ins {
			errText := in.ErrorMessage
			if errText == "" {
				errText = in.AgentError
			}
			row(w, in.Id, in.NodeName, status2(in.Status), phase(in.AgentPhase), in.Provider, pstate(in.PoolState), ago(in.LastHeartbeatAt), dash(oneLine(errText, 60)))
		}
	}
}

func oneLine(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > n {
		return s[:n-1] + "…"
	}
	return s
}

func (a *App) instanceDetail(in *v1.Instance) func(*tabwriter.Writer) {
	return func(w *tabwriter.Writer) {
		row(w, "id:", in.Id)
		row(w, "node:", in.NodeName)
		row(w, "status:", status2(in.Status))
		row(w, "provider:", in.Provider, dash(in.Region), dash(in.InstanceType))
		row(w, "machine:", dash(in.CloudInstanceId))
		row(w, "agent:", phase(in.AgentPhase), dash(in.AgentVersion))
		row(w, "last heartbeat:", when(in.LastHeartbeatAt), "("+ago(in.LastHeartbeatAt)+")")
		row(w, "addresses:", dash(strings.Join(in.Addresses, ", ")))
		row(w, "modules:", dash(strings.Join(in.RunningModuleDigests, ", ")))
		if in.PoolId != "" {
			row(w, "pool:", in.PoolId, pstate(in.PoolState), dash(in.ClaimId))
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
}

func (a *App) instanceCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "instance", Short: "Provision and drive instances"}
	var preq v1.ProvisionInstanceRequest
	provision := &cobra.Command{Use: "provision --node NAME --provider qemu|external [--operation-id ID]", Short: "Create an instance of a node", Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			c, err := a.dial()
			if err != nil {
				return err
			}
			ctx, cancel := a.ctx()
			defer cancel()
			resp, err := c.ProvisionInstance(ctx, &preq)
			if err != nil {
				return err
			}
			return a.print(resp, func(w *tabwriter.Writer) {
				a.instanceTable(resp.Instance)(w)
				if resp.Existing {
					row(w, "")
					row(w, "(an earlier call with this operation id created it)")
				}
				if resp.BootstrapToken != "" {
					row(w, "")
					row(w, "Boot the machine with this enrollment data (the token is shown once):")
					row(w, "  tether.url="+resp.ControlPlaneUrl, "tether.token="+resp.BootstrapToken, "tether.ca="+resp.CaFingerprint)
				}
			})
		}}
	pf := provision.Flags()
	pf.StringVar(&preq.Node, "node", "", "node to provision (required)")
	pf.StringVar(&preq.Provider, "provider", "", "qemu, external or another configured provider (required)")
	pf.StringVar(&preq.Region, "region", "", "provider region")
	pf.StringVar(&preq.InstanceType, "instance-type", "", "provider instance type")
	pf.StringVar(&preq.OperationId, "operation-id", "", "idempotency key: a retry with the same id returns the same instance")
	_ = provision.MarkFlagRequired("node")
	_ = provision.MarkFlagRequired("provider")

	var lreq v1.ListInstancesRequest
	var lstatus string
	list := &cobra.Command{Use: "list", Short: "List instances", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error {
		c, err := a.dial()
		if err != nil {
			return err
		}
		if lstatus != "" {
			v, ok := v1.InstanceStatus_value["INSTANCE_STATUS_"+strings.ToUpper(lstatus)]
			if !ok {
				return fmt.Errorf("--status %q: not an instance status", lstatus)
			}
			lreq.Status = v1.InstanceStatus(v)
		}
		lreq.PageSize = 1000
		ctx, cancel := a.ctx()
		defer cancel()
		resp, err := c.ListInstances(ctx, &lreq)
		if err != nil {
			return err
		}
		return a.print(resp, a.instanceTable(resp.Instances...))
	}}
	list.Flags().StringVar(&lreq.Node, "node", "", "only this node's instances")
	list.Flags().StringVar(&lreq.Pool, "pool", "", "only this pool's members")
	list.Flags().StringVar(&lstatus, "status", "", "only this status")

	get := &cobra.Command{Use: "get ID", Short: "Show an instance", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		c, err := a.dial()
		if err != nil {
			return err
		}
		ctx, cancel := a.ctx()
		defer cancel()
		in, err := c.GetInstance(ctx, &v1.GetInstanceRequest{Id: args[0]})
		if err != nil {
			return err
		}
		return a.print(in, a.instanceDetail(in))
	}}
	cmd.AddCommand(provision, list, get)

	type action func(context.Context, v1.AdminServiceClient, string) (*v1.Instance, error)
	simple := func(use, short string, do action) *cobra.Command {
		return &cobra.Command{Use: use + " ID", Short: short, Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
			c, err := a.dial()
			if err != nil {
				return err
			}
			ctx, cancel := a.ctx()
			defer cancel()
			in, err := do(ctx, c, args[0])
			if err != nil {
				return err
			}
			return a.print(in, a.instanceTable(in))
		}}
	}
	cmd.AddCommand(
		simple("start", "Start a stopped instance", func(ctx context.Context, c v1.AdminServiceClient, id string) (*v1.Instance, error) {
			return c.StartInstance(ctx, &v1.InstanceActionRequest{Id: id})
		}),
		simple("stop", "Stop a running instance", func(ctx context.Context, c v1.AdminServiceClient, id string) (*v1.Instance, error) {
			return c.StopInstance(ctx, &v1.InstanceActionRequest{Id: id})
		}),
		simple("reboot", "Reboot a running instance", func(ctx context.Context, c v1.AdminServiceClient, id string) (*v1.Instance, error) {
			return c.RebootInstance(ctx, &v1.InstanceActionRequest{Id: id})
		}),
		simple("terminate", "Destroy an instance's machine and revoke its identity", func(ctx context.Context, c v1.AdminServiceClient, id string) (*v1.Instance, error) {
			return c.TerminateInstance(ctx, &v1.InstanceActionRequest{Id: id})
		}),
		simple("unhold", "Clear an operator hold", func(ctx context.Context, c v1.AdminServiceClient, id string) (*v1.Instance, error) {
			return c.UnholdInstance(ctx, &v1.InstanceActionRequest{Id: id})
		}),
	)

	var reason string
	hold := &cobra.Command{Use: "hold ID --reason R", Short: "Refuse start, reboot and terminate until unhold", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		c, err := a.dial()
		if err != nil {
			return err
		}
		ctx, cancel := a.ctx()
		defer cancel()
		in, err := c.HoldInstance(ctx, &v1.HoldInstanceRequest{Id: args[0], Reason: reason})
		if err != nil {
			return err
		}
		return a.print(in, a.instanceTable(in))
	}}
	hold.Flags().StringVar(&reason, "reason", "", "why (required)")
	_ = hold.MarkFlagRequired("reason")

	var creason string
	cordon := &cobra.Command{Use: "cordon ID --reason R", Short: "Mark an instance unschedulable", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		c, err := a.dial()
		if err != nil {
			return err
		}
		ctx, cancel := a.ctx()
		defer cancel()
		resp, err := c.CordonInstance(ctx, &v1.CordonInstanceRequest{Id: args[0], Reason: creason})
		if err != nil {
			return err
		}
		return a.print(resp, func(w *tabwriter.Writer) {
			a.instanceTable(resp.Instance)(w)
			row(w, "")
			row(w, "cordon:", resp.CordonState)
		})
	}}
	cordon.Flags().StringVar(&creason, "reason", "", "why (required)")
	_ = cordon.MarkFlagRequired("reason")
	uncordon := &cobra.Command{Use: "uncordon ID", Short: "Clear a cordon", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		c, err := a.dial()
		if err != nil {
			return err
		}
		ctx, cancel := a.ctx()
		defer cancel()
		resp, err := c.UncordonInstance(ctx, &v1.InstanceActionRequest{Id: args[0]})
		if err != nil {
			return err
		}
		return a.print(resp, func(w *tabwriter.Writer) {
			a.instanceTable(resp.Instance)(w)
			row(w, "")
			row(w, "uncordon:", resp.UncordonState)
		})
	}}
	var dreason string
	drain := &cobra.Command{Use: "drain ID", Short: "Cordon, then stop", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		c, err := a.dial()
		if err != nil {
			return err
		}
		ctx, cancel := a.ctx()
		defer cancel()
		resp, err := c.DrainInstance(ctx, &v1.DrainInstanceRequest{Id: args[0], Reason: dreason})
		if err != nil {
			return err
		}
		return a.print(resp, func(w *tabwriter.Writer) {
			a.instanceTable(resp.Instance)(w)
			row(w, "")
			row(w, "cordon:", resp.CordonState)
		})
	}}
	drain.Flags().StringVar(&dreason, "reason", "drained by operator", "why")

	var follow bool
	var tail int64
	console := &cobra.Command{Use: "console ID", Short: "Show a qemu instance's serial console log", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		c, err := a.dial()
		if err != nil {
			return err
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		stream, err := c.GetInstanceConsole(ctx, &v1.GetInstanceConsoleRequest{Id: args[0], Follow: follow, TailBytes: tail})
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
			if _, err := a.Stdout.Write(chunk.Data); err != nil {
				return err
			}
		}
	}}
	console.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new output")
	console.Flags().Int64Var(&tail, "tail", 0, "only the last N bytes")

	var out string
	seed := &cobra.Command{Use: "seed-iso ID -o FILE", Short: "Write a seed ISO (TETHERSEED) with fresh enrollment data", Args: cobra.ExactArgs(1),
		// Here -o names the ISO file (docs/design.md §9.3), so the global check of -o
		// as an output format does not apply.
		PersistentPreRunE: func(*cobra.Command, []string) error { return nil },
		RunE: func(_ *cobra.Command, args []string) error {
			if out == "" && a.Output != "table" && a.Output != "json" {
				out, a.Output = a.Output, "table"
			}
			if out == "" {
				return errors.New("seed-iso: -o FILE is required")
			}
			c, err := a.dial()
			if err != nil {
				return err
			}
			ctx, cancel := a.ctx()
			defer cancel()
			resp, err := c.CreateSeedISO(ctx, &v1.CreateSeedISORequest{Id: args[0]})
			if err != nil {
				return err
			}
			if err := os.WriteFile(out, resp.Iso, 0o600); err != nil {
				return err
			}
			fmt.Fprintf(a.Stderr, "wrote %s (%s); it holds a one-time token: keep it private\n", out, humanBytes(int64(len(resp.Iso))))
			return nil
		}}
	seed.Flags().StringVar(&out, "file", "", "where to write the ISO (same as -o FILE)")
	var waitFor time.Duration
	wait := &cobra.Command{Use: "wait ID", Short: "Print each status and boot phase until the instance is running (or fails)", Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			c, err := a.dial()
			if err != nil {
				return err
			}
			return a.waitRunning(c, args[0], waitFor)
		}}
	wait.Flags().DurationVar(&waitFor, "for", 5*time.Minute, "give up after this long")
	cmd.AddCommand(hold, cordon, uncordon, drain, console, seed, wait)
	return cmd
}

// waitRunning polls the instance and prints every change of status, phase
// or error until it is running with a ready agent.
func (a *App) waitRunning(c v1.AdminServiceClient, id string, limit time.Duration) error {
	start := time.Now()
	last := ""
	for {
		ctx, cancel := a.ctx()
		in, err := c.GetInstance(ctx, &v1.GetInstanceRequest{Id: id})
		cancel()
		if err != nil {
			return err
		}
		errText := in.AgentError
		if errText == "" {
			errText = in.ErrorMessage
		}
		line := fmt.Sprintf("%-12s %-12s %s", status2(in.Status), phase(in.AgentPhase), errText)
		if line != last {
			fmt.Fprintf(a.Stdout, "%7.2fs  %s\n", time.Since(start).Seconds(), strings.TrimSpace(line))
			last = line
		}
		switch {
		case in.Status == v1.InstanceStatus_INSTANCE_STATUS_RUNNING && in.AgentPhase == v1.AgentPhase_AGENT_PHASE_READY:
			return nil
		case in.Status == v1.InstanceStatus_INSTANCE_STATUS_ERROR, in.Status == v1.InstanceStatus_INSTANCE_STATUS_TERMINATED:
			return fmt.Errorf("instance %s is %s: %s (see tetherctl instance console %s)", id, status2(in.Status), errText, id)
		case time.Since(start) > limit:
			return fmt.Errorf("instance %s is still %s after %s (see tetherctl instance console %s)", id, strings.TrimSpace(line), limit, id)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (a *App) tokenCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Bootstrap tokens"}
	var id string
	var ttl time.Duration
	create := &cobra.Command{Use: "create --instance ID", Short: "Issue a one-time enrollment token (printed once)", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error {
		c, err := a.dial()
		if err != nil {
			return err
		}
		ctx, cancel := a.ctx()
		defer cancel()
		resp, err := c.CreateBootstrapToken(ctx, &v1.CreateBootstrapTokenRequest{InstanceId: id, TtlSeconds: int32(ttl / time.Second)})
		if err != nil {
			return err
		}
		return a.print(resp, func(w *tabwriter.Writer) {
			row(w, "token:", resp.Token)
			row(w, "instance:", resp.InstanceId)
			row(w, "expires:", when(resp.ExpiresAt))
			row(w, "kernel args:", "tether.url="+resp.ControlPlaneUrl+" tether.token="+resp.Token+" tether.ca="+resp.CaFingerprint)
		})
	}}
	create.Flags().StringVar(&id, "instance", "", "instance id (required)")
	create.Flags().DurationVar(&ttl, "ttl", 0, "lifetime (default 24h)")
	_ = create.MarkFlagRequired("instance")
	cmd.AddCommand(create)
	return cmd
}

func (a *App) taskTable(ts ...*v1.Task) func(*tabwriter.Writer) {
	return func(w *tabwriter.Writer) {
		row(w, "ID", "INSTANCE", "TARGET", "KIND", "STATUS", "ATTEMPTS", "EXIT", "CREATED")
		for _, t := range ts {
			exit := "-"
			if t.Result != nil && (t.Status == v1.TaskStatus_TASK_STATUS_SUCCEEDED || t.Status == v1.TaskStatus_TASK_STATUS_FAILED) {
				exit = fmt.Sprint(t.Result.ExitCode)
			}
			row(w, t.Id, t.InstanceId, enumText(t.Target.String(), "TASK_TARGET_"), enumText(t.Kind.String(), "TASK_KIND_"),
				enumText(t.Status.String(), "TASK_STATUS_"), fmt.Sprintf("%d/%d", t.Attempts, t.MaxAttempts), exit, when(t.CreatedAt))
		}
	}
}

func (a *App) taskCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "task", Short: "Agent and worker tasks"}
	var instance string
	var maxAttempts int32
	var timeout time.Duration
	var wait bool
	create := &cobra.Command{
		Use:   "create --instance ID exec [--timeout D] -- ARGV... | reboot | poweroff | module_sync | renew_certificate",
		Short: "Create an agent task; it is pushed to the agent at once",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			kindName := args[0]
			kv, ok := v1.TaskKind_value["TASK_KIND_"+strings.ToUpper(kindName)]
			if !ok {
				return fmt.Errorf("task kind %q: want exec, reboot, poweroff, module_sync or renew_certificate", kindName)
			}
			req := &v1.CreateTaskRequest{InstanceId: instance, Kind: v1.TaskKind(kv), MaxAttempts: maxAttempts}
			if kindName == "exec" {
				argv := args[1:]
				if len(argv) == 0 {
					return errors.New("exec needs a command: tetherctl task create --instance ID exec -- cat /etc/os-release")
				}
				req.Exec = &v1.ExecPayload{Argv: argv, TimeoutSeconds: int32(timeout / time.Second)}
			} else if len(args) > 1 {
				return fmt.Errorf("%s takes no arguments", kindName)
			}
			c, err := a.dial()
			if err != nil {
				return err
			}
			ctx, cancel := a.ctx()
			defer cancel()
			t, err := c.CreateTask(ctx, req)
			if err != nil {
				return err
			}
			if wait {
				if t, err = a.waitTask(c, t.Id); err != nil {
					return err
				}
				return a.print(t, a.taskDetail(t))
			}
			return a.print(t, a.taskTable(t))
		},
	}
	create.Flags().StringVar(&instance, "instance", "", "instance id (required)")
	create.Flags().Int32Var(&maxAttempts, "max-attempts", 0, "attempts before the task fails (default 3)")
	create.Flags().DurationVar(&timeout, "timeout", 0, "exec timeout (default 5m)")
	create.Flags().BoolVar(&wait, "wait", false, "wait for the result and print it")
	_ = create.MarkFlagRequired("instance")

	var lreq v1.ListTasksRequest
	var target string
	list := &cobra.Command{Use: "list [--instance ID] [--target agent|worker]", Short: "List tasks", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error {
		if target != "" {
			v, ok := v1.TaskTarget_value["TASK_TARGET_"+strings.ToUpper(target)]
			if !ok {
				return fmt.Errorf("--target %q: want agent or worker", target)
			}
			lreq.Target = v1.TaskTarget(v)
		}
		c, err := a.dial()
		if err != nil {
			return err
		}
		lreq.PageSize = 1000
		ctx, cancel := a.ctx()
		defer cancel()
		resp, err := c.ListTasks(ctx, &lreq)
		if err != nil {
			return err
		}
		return a.print(resp, a.taskTable(resp.Tasks...))
	}}
	list.Flags().StringVar(&lreq.InstanceId, "instance", "", "only this instance's tasks")
	list.Flags().StringVar(&target, "target", "", "agent or worker")
	get := &cobra.Command{Use: "get ID", Short: "Show a task with its exit code and output", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		c, err := a.dial()
		if err != nil {
			return err
		}
		ctx, cancel := a.ctx()
		defer cancel()
		t, err := c.GetTask(ctx, &v1.GetTaskRequest{Id: args[0]})
		if err != nil {
			return err
		}
		return a.print(t, a.taskDetail(t))
	}}
	cancelCmd := &cobra.Command{Use: "cancel ID", Short: "Cancel a task", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		c, err := a.dial()
		if err != nil {
			return err
		}
		ctx, cancel := a.ctx()
		defer cancel()
		t, err := c.CancelTask(ctx, &v1.CancelTaskRequest{Id: args[0]})
		if err != nil {
			return err
		}
		return a.print(t, a.taskTable(t))
	}}
	cmd.AddCommand(create, list, get, cancelCmd)
	return cmd
}

func (a *App) waitTask(c v1.AdminServiceClient, id string) (*v1.Task, error) {
	deadline := time.Now().Add(a.Timeout)
	for {
		ctx, cancel := a.ctx()
		t, err := c.GetTask(ctx, &v1.GetTaskRequest{Id: id})
		cancel()
		if err != nil {
			return nil, err
		}
		switch t.Status {
		case v1.TaskStatus_TASK_STATUS_SUCCEEDED, v1.TaskStatus_TASK_STATUS_FAILED, v1.TaskStatus_TASK_STATUS_CANCELLED:
			return t, nil
		}
		if time.Now().After(deadline) {
			return nil, status.Errorf(codes.DeadlineExceeded, "task %s is still %s", id, enumText(t.Status.String(), "TASK_STATUS_"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (a *App) taskDetail(t *v1.Task) func(*tabwriter.Writer) {
	return func(w *tabwriter.Writer) {
		row(w, "id:", t.Id)
		row(w, "instance:", t.InstanceId)
		row(w, "kind:", enumText(t.Kind.String(), "TASK_KIND_"), "("+enumText(t.Target.String(), "TASK_TARGET_")+")")
		if t.Exec != nil {
			row(w, "argv:", strings.Join(t.Exec.Argv, " "))
		}
		row(w, "status:", enumText(t.Status.String(), "TASK_STATUS_"))
		row(w, "attempts:", fmt.Sprintf("%d/%d", t.Attempts, t.MaxAttempts))
		if t.Progress != "" {
			row(w, "progress:", t.Progress)
		}
		if t.ErrorMessage != "" {
			row(w, "error:", t.ErrorMessage)
		}
		if r := t.Result; r != nil {
			row(w, "exit code:", r.ExitCode)
			trunc := ""
			if r.OutputTruncated {
				trunc = " (truncated)"
			}
			row(w, "output"+trunc+":")
			w.Flush()
			fmt.Fprint(a.Stdout, string(r.Output))
			if len(r.Output) > 0 && r.Output[len(r.Output)-1] != '\n' {
				fmt.Fprintln(a.Stdout)
			}
		}
	}
}

func (a *App) certCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "cert", Short: "Issued certificates"}
	var instance string
	list := &cobra.Command{Use: "list [--instance ID]", Short: "List certificates", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error {
		c, err := a.dial()
		if err != nil {
			return err
		}
		ctx, cancel := a.ctx()
		defer cancel()
		resp, err := c.ListCertificates(ctx, &v1.ListCertificatesRequest{InstanceId: instance, PageSize: 1000})
		if err != nil {
			return err
		}
		return a.print(resp, func(w *tabwriter.Writer) {
			row(w, "SERIAL", "INSTANCE", "KIND", "NOT AFTER", "REVOKED")
			for _, ct := range resp.Certificates {
				rev := "-"
				if ct.RevokedAt != nil {
					rev = when(ct.RevokedAt) + " " + ct.RevokeReason
				}
				row(w, ct.Serial, dash(ct.InstanceId), enumText(ct.Kind.String(), "CERTIFICATE_KIND_"), when(ct.NotAfter), rev)
			}
		})
	}}
	list.Flags().StringVar(&instance, "instance", "", "only this instance's certificates")
	var reason string
	revoke := &cobra.Command{Use: "revoke SERIAL", Short: "Revoke a certificate", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		c, err := a.dial()
		if err != nil {
			return err
		}
		ctx, cancel := a.ctx()
		defer cancel()
		ct, err := c.RevokeCertificate(ctx, &v1.RevokeCertificateRequest{Serial: args[0], Reason: reason})
		if err != nil {
			return err
		}
		return a.print(ct, func(w *tabwriter.Writer) { row(w, "revoked", ct.Serial, when(ct.RevokedAt), ct.RevokeReason) })
	}}
	revoke.Flags().StringVar(&reason, "reason", "", "why")
	cmd.AddCommand(list, revoke)
	return cmd
}

func (a *App) eventsCmd() *cobra.Command {
	var req v1.ListEventsRequest
	var watch bool
	var limit int32
	cmd := &cobra.Command{Use: "events [--kind K] [--instance ID] [--pool P] [--correlation C] [--watch]", Short: "Read the fleet event log, newest first", Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			c, err := a.dial()
			if err != nil {
				return err
			}
			if req.PoolId != "" {
				// Accept a pool name as well as an id.
				ctx, cancel := a.ctx()
				if p, err := c.GetPool(ctx, &v1.GetPoolRequest{Name: req.PoolId}); err == nil {
					req.PoolId = p.Id
				}
				cancel()
			}
			if watch {
				return a.watchEvents(c, &req)
			}
			req.PageSize = limit
			ctx, cancel := a.ctx()
			defer cancel()
			resp, err := c.ListEvents(ctx, &req)
			if err != nil {
				return err
			}
			return a.print(resp, func(w *tabwriter.Writer) {
				row(w, "TIME", "SEVERITY", "KIND", "INSTANCE", "CORRELATION", "MESSAGE")
				for _, e := range resp.Events {
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
	f.Int32Var(&limit, "limit", 100, "how many events")
	return cmd
}

func eventRow(w io.Writer, e *v1.FleetEvent) {
	row(w, when(e.CreatedAt), enumText(e.Severity.String(), "SEVERITY_"), e.Kind, dash(e.InstanceId), dash(e.CorrelationId), oneLine(e.Message, 100))
}

func (a *App) watchEvents(c v1.AdminServiceClient, req *v1.ListEventsRequest) error {
	stream, err := c.WatchEvents(context.Background(), &v1.WatchEventsRequest{Kind: req.Kind, InstanceId: req.InstanceId,
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
			b, _ := jsonOut.Marshal(e)
			fmt.Fprintln(a.Stdout, string(b))
			continue
		}
		eventRow(w, e)
		w.Flush()
	}
}
