// Package tasks serves the agent task RPCs of AdminService: create,
// read, list and cancel the tasks pushed to an instance's agent. The
// queue lives in controlplane/tasks; these handlers check the request's
// shape and convert.
package tasks

import (
	"context"
	"errors"

	"github.com/tetherfleet/tether/controlplane/api/admin/adminkit"
	"github.com/tetherfleet/tether/controlplane/api/protoconv"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/tasks"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// Reads are the store reads the task RPCs make.
type Reads interface {
	GetTask(ctx context.Context, id store.TaskID) (*store.Task, error)
	ListTasks(ctx context.Context, f store.TaskFilter, p store.Page) ([]*store.Task, error)
}

// Config is what the task RPCs use (both required).
type Config struct {
	Tasks *tasks.Service
	Store Reads
}

// Server serves the task RPCs.
type Server struct {
	cfg Config
}

// New builds the task RPCs, naming a missing dependency.
func New(cfg Config) (*Server, error) {
	switch {
	case cfg.Tasks == nil:
		return nil, errors.New("tasks: Config.Tasks is required")
	case cfg.Store == nil:
		return nil, errors.New("tasks: Config.Store is required")
	}
	return &Server{cfg: cfg}, nil
}

// CreateTask implements AdminService.
func (a *Server) CreateTask(ctx context.Context, req *v1.CreateTaskRequest) (*v1.Task, error) {
	var exec *tasks.Exec
	if req.Exec != nil {
		exec = &tasks.Exec{Argv: req.Exec.Argv, TimeoutSeconds: req.Exec.TimeoutSeconds}
	}
	if req.Kind == v1.TaskKind_TASK_KIND_UNSPECIFIED {
		return nil, fail.Invalid("kind", "required")
	}
	kind, err := protoconv.TaskKindFrom(req.Kind)
	if err != nil {
		return nil, fail.Invalid("kind", "%v", err)
	}
	t, err := a.cfg.Tasks.CreateAgentTask(ctx, store.InstanceID(req.InstanceId), kind, exec, int(req.MaxAttempts))
	if err != nil {
		return nil, err
	}
	return adminkit.TaskProto(t), nil
}

// GetTask implements AdminService.
func (a *Server) GetTask(ctx context.Context, req *v1.GetTaskRequest) (*v1.Task, error) {
	if req.Id == "" {
		return nil, fail.Invalid("id", "required")
	}
	t, err := a.cfg.Store.GetTask(ctx, store.TaskID(req.Id))
	if err != nil {
		return nil, err
	}
	return adminkit.TaskProto(t), nil
}

// ListTasks implements AdminService.
func (a *Server) ListTasks(ctx context.Context, req *v1.ListTasksRequest) (*v1.ListTasksResponse, error) {
	p, err := adminkit.Page(req.PageSize, req.PageToken)
	if err != nil {
		return nil, err
	}
	target, err := protoconv.TaskTargetFrom(req.Target)
	if err != nil {
		return nil, fail.Invalid("target", "%v", err)
	}
	status, err := protoconv.TaskStatusFrom(req.Status)
	if err != nil {
		return nil, fail.Invalid("status", "%v", err)
	}
	f := store.TaskFilter{InstanceID: store.InstanceID(req.InstanceId), Target: target}
	if status != "" {
		f.Statuses = []store.TaskStatus{status}
	}
	ts, err := a.cfg.Store.ListTasks(ctx, f, p)
	if err != nil {
		return nil, err
	}
	out := &v1.ListTasksResponse{}
	if out.Tasks, out.NextPageToken, err = adminkit.Fill(ts, p.Limit,
		func(t *store.Task) (*v1.Task, error) { return adminkit.TaskProto(t), nil },
		func(t *store.Task) string { return t.ID.String() }); err != nil {
		return nil, err
	}
	return out, nil
}

// CancelTask implements AdminService.
func (a *Server) CancelTask(ctx context.Context, req *v1.CancelTaskRequest) (*v1.Task, error) {
	if req.Id == "" {
		return nil, fail.Invalid("id", "required")
	}
	t, err := a.cfg.Tasks.Cancel(ctx, store.TaskID(req.Id))
	if err != nil {
		return nil, err
	}
	return adminkit.TaskProto(t), nil
}
