package tetherctl

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

func taskStatus(s v1.TaskStatus) string { return enumText(s.String(), "TASK_STATUS_") }

func taskTable(w *tabwriter.Writer, ts []*v1.Task) {
	row(w, "ID", "INSTANCE", "TARGET", "KIND", "STATUS", "ATTEMPTS", "EXIT", "CREATED")
	for _, t := range ts {
		exit := "-"
		if t.Result != nil && (t.Status == v1.TaskStatus_TASK_STATUS_SUCCEEDED || t.Status == v1.TaskStatus_TASK_STATUS_FAILED) {
			exit = fmt.Sprint(t.Result.ExitCode)
		}
		row(w, t.Id, t.InstanceId, enumText(t.Target.String(), "TASK_TARGET_"), enumText(t.Kind.String(), "TASK_KIND_"),
			taskStatus(t.Status), fmt.Sprintf("%d/%d", t.Attempts, t.MaxAttempts), exit, when(t.CreatedAt))
	}
}

func (a *App) taskDetail(w *tabwriter.Writer, t *v1.Task) {
	row(w, "id:", t.Id)
	row(w, "instance:", t.InstanceId)
	row(w, "kind:", enumText(t.Kind.String(), "TASK_KIND_"), "("+enumText(t.Target.String(), "TASK_TARGET_")+")")
	if t.Exec != nil {
		row(w, "argv:", strings.Join(t.Exec.Argv, " "))
	}
	row(w, "status:", taskStatus(t.Status))
	// Attempts counts the leases that ran out (design §6.2), not the runs:
	// a task done on its first run has 0, which "attempts: 0/3" misread.
	row(w, "lost leases:", fmt.Sprintf("%d (the task fails at %d)", t.Attempts, t.MaxAttempts))
	if t.Progress != "" {
		row(w, "progress:", t.Progress)
	}
	if t.ErrorMessage != "" {
		row(w, "error:", t.ErrorMessage)
	}
	if r := t.Result; r != nil {
		row(w, "exit code:", r.ExitCode)
		truncated := ""
		if r.OutputTruncated {
			truncated = " (truncated)"
		}
		row(w, "output"+truncated+":")
		// The output keeps its lines and tabs (so it bypasses the
		// tabwriter) and loses only what would drive the terminal.
		w.Flush()
		out := printableText(string(r.Output))
		fmt.Fprint(a.Stdout, out)
		if len(out) > 0 && out[len(out)-1] != '\n' {
			fmt.Fprintln(a.Stdout)
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
			if !wait {
				return call(a, v1.AdminServiceClient.CreateTask, req, one(taskTable))
			}
			t, err := invoke(a, v1.AdminServiceClient.CreateTask, req)
			if err != nil {
				return err
			}
			if t, err = a.waitTask(t.Id); err != nil {
				return err
			}
			return a.print(t, func(w *tabwriter.Writer) { a.taskDetail(w, t) })
		},
	}
	create.Flags().StringVar(&instance, "instance", "", "instance id (required)")
	create.Flags().Int32Var(&maxAttempts, "max-attempts", 0, "attempts before the task fails (default 3)")
	create.Flags().DurationVar(&timeout, "timeout", 0, "exec timeout (default 5m)")
	create.Flags().BoolVar(&wait, "wait", false, "wait for the result and print it")
	_ = create.MarkFlagRequired("instance")

	var listReq v1.ListTasksRequest
	var target string
	var pg paging
	listCmd := &cobra.Command{Use: "list [--instance ID] [--target agent|worker]", Short: "List tasks", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error {
		var err error
		if listReq.Target, err = parseEnum[v1.TaskTarget]("target", target, "TASK_TARGET_", v1.TaskTarget_value, "agent or worker"); err != nil {
			return err
		}
		return list(a, v1.AdminServiceClient.ListTasks, &listReq, pg, func(w *tabwriter.Writer, r *v1.ListTasksResponse) { taskTable(w, r.Tasks) })
	}}
	listCmd.Flags().StringVar(&listReq.InstanceId, "instance", "", "only this instance's tasks")
	listCmd.Flags().StringVar(&target, "target", "", "agent or worker")
	pg.flags(listCmd.Flags(), 0, "tasks")
	get := &cobra.Command{Use: "get ID", Short: "Show a task with its exit code and output", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		return call(a, v1.AdminServiceClient.GetTask, &v1.GetTaskRequest{Id: args[0]}, a.taskDetail)
	}}
	cancelCmd := &cobra.Command{Use: "cancel ID", Short: "Cancel a task", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		return call(a, v1.AdminServiceClient.CancelTask, &v1.CancelTaskRequest{Id: args[0]}, one(taskTable))
	}}
	cmd.AddCommand(create, listCmd, get, cancelCmd)
	return cmd
}

// waitTask polls until the task ends or --timeout passes; an interrupt
// ends it at once.
func (a *App) waitTask(id string) (*v1.Task, error) {
	deadline := time.Now().Add(a.Timeout)
	for {
		t, err := invoke(a, v1.AdminServiceClient.GetTask, &v1.GetTaskRequest{Id: id})
		if err != nil {
			return nil, err
		}
		switch t.Status {
		case v1.TaskStatus_TASK_STATUS_SUCCEEDED, v1.TaskStatus_TASK_STATUS_FAILED, v1.TaskStatus_TASK_STATUS_CANCELLED:
			return t, nil
		}
		if time.Now().After(deadline) {
			return nil, status.Errorf(codes.DeadlineExceeded, "task %s is still %s", id, taskStatus(t.Status))
		}
		if err := sleep(a.base, pollEvery); err != nil {
			return nil, err
		}
	}
}
