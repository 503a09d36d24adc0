package instances

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/providers"
)

// Worker task kinds (docs/design.md §6.1): provider work the control plane runs itself.
const (
	TaskProvision = store.TaskKindProvision
	TaskStart     = store.TaskKindStart
	TaskStop      = store.TaskKindStop
	TaskReboot    = store.TaskKindReboot
)

// ProviderNames lists the configured providers, sorted.
func (s *Service) ProviderNames() []string {
	names := make([]string, 0, len(s.Machines))
	for n := range s.Machines {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Provider returns the provider an instance was provisioned on. A
// provider that is no longer configured (tetherd restarted without it) is
// FailedPrecondition: nothing can act on that instance's machine here.
func (s *Service) Provider(name string) (providers.Provider, error) {
	p, ok := s.Machines[name]
	if !ok {
		return nil, fail.Precondition("provider %q is not configured in this control plane (configured: %v)", name, s.ProviderNames())
	}
	return p, nil
}

// findMachine looks for the machine of an instance in its provider's list:
// the way to learn the machine of a provision whose answer was lost. It
// reports false when the provider cannot list (external), lists none, or
// fails (see lookupMachine for callers that must tell those apart).
func (s *Service) findMachine(ctx context.Context, p providers.Provider, instanceID store.InstanceID) (providers.Machine, bool) {
	m, ok, err := s.lookupMachine(ctx, p, instanceID)
	if err != nil {
		s.Log.Warn("list machines to find an instance's machine", "provider", p.Name(), "instance", instanceID, "err", err)
	}
	return m, ok
}

// lookupMachine is findMachine that returns the list's failure. A provider
// that cannot list at all (KindUnsupported) is not a failure: it has no
// machines to find.
func (s *Service) lookupMachine(ctx context.Context, p providers.Provider, instanceID store.InstanceID) (providers.Machine, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout())
	defer cancel()
	ms, err := p.List(ctx)
	if err != nil {
		if providers.KindOf(err) == providers.KindUnsupported {
			return providers.Machine{}, false, nil
		}
		return providers.Machine{}, false, err
	}
	i := slices.IndexFunc(ms, func(m providers.Machine) bool {
		return m.InstanceID == instanceID.String() && m.State != providers.StateGone
	})
	if i < 0 {
		return providers.Machine{}, false, nil
	}
	return ms[i], true, nil
}

// machineID is the provider's id of an instance's machine, looked up in
// the provider's list when the row has none recorded ("" when there is
// none). A failed lookup is an error: "no machine" must not be guessed.
func (s *Service) machineID(ctx context.Context, p providers.Provider, in *store.Instance) (string, error) {
	if in.CloudInstanceID != "" {
		return in.CloudInstanceID, nil
	}
	m, ok, err := s.lookupMachine(ctx, p, in.ID)
	if err != nil || !ok {
		return "", err
	}
	return m.ID, nil
}

// observed is what the provider says a machine is, after a call failed.
type observed struct {
	state providers.MachineState
	// err is set when Status itself failed: the state is then unknown.
	err error
}

func (o observed) String() string {
	if o.err != nil {
		return fmt.Sprintf("unknown (status failed: %v)", o.err)
	}
	return string(o.state)
}

// observe asks the provider for a machine's state. It runs on its own
// deadline: the caller's context may be the very thing that failed.
func (s *Service) observe(ctx context.Context, p providers.Provider, id string) observed {
	if id == "" {
		return observed{state: providers.StateGone}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opTimeout())
	defer cancel()
	m, err := p.Status(ctx, id)
	if err != nil {
		if providers.IsNotFound(err) {
			return observed{state: providers.StateGone}
		}
		return observed{state: providers.StateUnknown, err: err}
	}
	return observed{state: m.State}
}

func (s *Service) opTimeout() time.Duration {
	if s.OpTimeout > 0 {
		return s.OpTimeout
	}
	return DefaultOpTimeout
}

func (s *Service) owner() string {
	if s.Owner != "" {
		return s.Owner
	}
	return "instances:local"
}

// errKind is the provider kind of err, "" when err is not a provider
// error (a store or context error).
func errKind(err error) providers.Kind {
	var pe *providers.Error
	if errors.As(err, &pe) {
		return pe.Kind
	}
	return ""
}
