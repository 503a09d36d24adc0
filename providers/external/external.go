// Package external is the provider for machines that something else starts:
// a rack of physical servers netbooting over iPXE, or VMs another system
// manages. Tether issues their enrollment token and serves their netboot
// artifacts itself; it cannot power them on or off and cannot see them, so
// this provider answers truthfully that it does not know rather than
// pretending.
package external

import (
	"context"
	"strings"

	"github.com/tetherfleet/tether/providers"
)

// Name is the provider's registered name.
const Name = "external"

// IDPrefix starts every machine id this provider hands out, so an id names
// its provider when it shows up in logs and rows.
const IDPrefix = "external:"

const notManaged = "not managed by this control plane"

// Provider is the external provider. It is stateless, so the zero value is
// ready to use.
type Provider struct{}

// New returns the external provider.
func New() *Provider { return &Provider{} }

var _ providers.Provider = (*Provider)(nil)

// Name implements providers.Provider.
func (*Provider) Name() string { return Name }

// Provision records nothing and boots nothing: the machine boots on its own
// and enrolls with the token the control plane issued. Its state is unknown
// until its agent heartbeats.
func (*Provider) Provision(_ context.Context, spec providers.Spec) (providers.Machine, error) {
	if spec.InstanceID == "" {
		return providers.Machine{}, providers.Errorf(providers.KindPermanent, Name, "provision", "instance id is required")
	}
	return providers.Machine{
		ID:         IDPrefix + spec.InstanceID,
		InstanceID: spec.InstanceID,
		State:      providers.StateUnknown,
		Detail:     "started outside Tether; state is known from the agent's heartbeats only",
	}, nil
}

// Start implements providers.Provider; the machine's power is not ours.
func (*Provider) Start(context.Context, string, providers.Boot) (providers.Machine, error) {
	return providers.Machine{}, unsupported("start")
}

// Stop implements providers.Provider; the machine's power is not ours.
func (*Provider) Stop(context.Context, string) (providers.Machine, error) {
	return providers.Machine{}, unsupported("stop")
}

// Reboot implements providers.Provider. An agent-side reboot task is the way
// to reboot such a machine.
func (*Provider) Reboot(context.Context, string, providers.Boot) (providers.Machine, error) {
	return providers.Machine{}, unsupported("reboot")
}

// Terminate succeeds: there is nothing here to destroy. What makes the
// machine harmless is the control plane revoking its identity on terminate.
func (*Provider) Terminate(context.Context, string) error { return nil }

// Status is always unknown: the provider cannot observe the machine, and
// claiming gone or running would be a guess.
func (*Provider) Status(_ context.Context, id string) (providers.Machine, error) {
	return providers.Machine{
		ID:         id,
		InstanceID: strings.TrimPrefix(id, IDPrefix),
		State:      providers.StateUnknown,
		Detail:     "started outside Tether; state is not observable",
	}, nil
}

// List answers KindUnsupported rather than an empty list: an empty list
// would tell the provider-sync loop that every external machine is gone and
// make it error their instances. The loop skips a provider whose List is
// unsupported.
func (*Provider) List(context.Context) ([]providers.Machine, error) {
	return nil, unsupported("list")
}

func unsupported(op string) error {
	return providers.Errorf(providers.KindUnsupported, Name, op, notManaged)
}
