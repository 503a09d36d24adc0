package instances

import (
	"context"

	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/worker"
	"github.com/tetherfleet/tether/internal/seediso"
)

// consoleLogger is implemented by providers that keep a machine's serial
// console in a file (qemu).
type consoleLogger interface {
	ConsoleLogPath(id string) string
}

// ConsoleLogPath returns the file an instance's serial console is written
// to. Providers without one answer FailedPrecondition.
func (s *Service) ConsoleLogPath(ctx context.Context, id store.InstanceID) (string, error) {
	if id == "" {
		return "", fail.Invalid("id", "required")
	}
	in, err := s.Store.GetInstance(ctx, id)
	if err != nil {
		return "", err
	}
	p, err := s.Provider(in.Provider)
	if err != nil {
		return "", err
	}
	cl, ok := p.(consoleLogger)
	if !ok {
		return "", fail.Precondition("provider %s keeps no console log for instance %s", in.Provider, id)
	}
	machine := in.CloudInstanceID
	if machine == "" {
		machine = in.ID.String()
	}
	path := cl.ConsoleLogPath(machine)
	if path == "" {
		return "", fail.Precondition("provider %s has no console log for instance %s (is the provider disabled?)", in.Provider, id)
	}
	return path, nil
}

// SeedMaterial issues a fresh one-time token for an instance and returns
// it with the rest of the enrollment data, for a seed ISO (docs/design.md §3.2).
func (s *Service) SeedMaterial(ctx context.Context, id store.InstanceID) (seediso.Material, error) {
	if id == "" {
		return seediso.Material{}, fail.Invalid("id", "required")
	}
	in, err := s.Store.GetInstance(ctx, id)
	if err != nil {
		return seediso.Material{}, err
	}
	if in.Status.Terminal() {
		return seediso.Material{}, fail.Precondition("instance %s is terminated; it cannot enroll again", id)
	}
	tok, _, err := s.IssueToken(ctx, id, 0)
	if err != nil {
		return seediso.Material{}, err
	}
	return seediso.Material{URL: s.AgentURL, Token: tok, CA: s.Fingerprint()}, nil
}

// Handlers are the worker handlers of the instance task kinds.
func (s *Service) Handlers() map[store.TaskKind]worker.Handler {
	return map[store.TaskKind]worker.Handler{
		TaskProvision: s.RunProvision,
		TaskStart:     s.RunOp,
		TaskStop:      s.RunOp,
		TaskReboot:    s.RunOp,
	}
}
