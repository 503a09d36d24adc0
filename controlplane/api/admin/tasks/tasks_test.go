package tasks_test

import (
	"context"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/controlplane/api/admin/adminkit"
	admintasks "github.com/tetherfleet/tether/controlplane/api/admin/tasks"
	"github.com/tetherfleet/tether/internal/testkit/admintest"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// serve starts only the task RPCs, over a real store, with one instance.
func serve(t *testing.T) (*admintasks.Server, string) {
	t.Helper()
	env := admintest.New(t)
	in := env.Instance(t, "n1")
	s, err := admintasks.New(admintasks.Config{Tasks: env.Services.Tasks, Store: env.Store})
	if err != nil {
		t.Fatal(err)
	}
	return s, in.ID.String()
}

func listed(t *testing.T, s *admintasks.Server, id string) string {
	t.Helper()
	resp, err := s.ListTasks(context.Background(), &v1.ListTasksRequest{InstanceId: id})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, x := range resp.Tasks {
		out = append(out, x.Id+"/"+x.Status.String())
	}
	return strings.Join(out, ",")
}

func TestTaskRPCs(t *testing.T) {
	s, id := serve(t)
	ctx := admintest.As("olga", adminkit.RoleOperator)
	created, err := s.CreateTask(ctx, &v1.CreateTaskRequest{InstanceId: id, Kind: v1.TaskKind_TASK_KIND_EXEC,
		Exec: &v1.ExecPayload{Argv: []string{"uptime"}}})
	if err != nil || created.Status != v1.TaskStatus_TASK_STATUS_PENDING || created.Exec.GetArgv()[0] != "uptime" {
		t.Fatalf("CreateTask = %v, %v; want a pending exec task", created, err)
	}
	if got, err := s.GetTask(ctx, &v1.GetTaskRequest{Id: created.Id}); err != nil || got.Id != created.Id {
		t.Fatalf("GetTask = %v, %v", got, err)
	}
	if l := listed(t, s, id); !strings.Contains(l, created.Id+"/TASK_STATUS_PENDING") {
		t.Fatalf("tasks = %q; want the one created among them", l)
	}
	cancelled, err := s.CancelTask(ctx, &v1.CancelTaskRequest{Id: created.Id})
	if err != nil || cancelled.Status != v1.TaskStatus_TASK_STATUS_CANCELLED {
		t.Fatalf("CancelTask = %v, %v; want it cancelled", cancelled, err)
	}
}

func TestTaskRPCsRefuseBadInput(t *testing.T) {
	s, id := serve(t)
	ctx := admintest.As("olga", adminkit.RoleOperator)
	before := listed(t, s, id) // the provisioning's own task
	tests := []struct {
		name  string
		call  func() error
		field string
	}{
		{"create without a kind", func() error {
			_, err := s.CreateTask(ctx, &v1.CreateTaskRequest{InstanceId: id})
			return err
		}, "kind"},
		{"create without an instance", func() error {
			_, err := s.CreateTask(ctx, &v1.CreateTaskRequest{Kind: v1.TaskKind_TASK_KIND_REBOOT})
			return err
		}, "instance_id"},
		{"an exec payload on a reboot", func() error {
			_, err := s.CreateTask(ctx, &v1.CreateTaskRequest{InstanceId: id, Kind: v1.TaskKind_TASK_KIND_REBOOT,
				Exec: &v1.ExecPayload{Argv: []string{"x"}}})
			return err
		}, "exec"},
		{"get naming nothing", func() error {
			_, err := s.GetTask(ctx, &v1.GetTaskRequest{})
			return err
		}, "id"},
		{"cancel naming nothing", func() error {
			_, err := s.CancelTask(ctx, &v1.CancelTaskRequest{})
			return err
		}, "id"},
		{"create with a kind the proto does not name", func() error {
			_, err := s.CreateTask(ctx, &v1.CreateTaskRequest{InstanceId: id, Kind: v1.TaskKind(99)})
			return err
		}, "kind"},
		{"list by a target the proto does not name", func() error {
			_, err := s.ListTasks(ctx, &v1.ListTasksRequest{InstanceId: id, Target: v1.TaskTarget(99)})
			return err
		}, "target"},
		{"list by a status the proto does not name", func() error {
			_, err := s.ListTasks(ctx, &v1.ListTasksRequest{InstanceId: id, Status: v1.TaskStatus(99)})
			return err
		}, "status"},
		{"list with a negative page size", func() error {
			_, err := s.ListTasks(ctx, &v1.ListTasksRequest{PageSize: -1})
			return err
		}, "page_size"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			admintest.WantInvalid(t, err, tt.field)
			if l := listed(t, s, id); l != before {
				t.Fatalf("tasks = %q after a refused call; want %q", l, before)
			}
		})
	}
}
