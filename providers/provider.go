// Package providers defines how the control plane creates and controls the
// machines that netboot Tether's images. Implementations live in
// sub-packages (qemu, external, fake).
//
// Every method is idempotent: provisioning a machine that exists returns it,
// stopping a stopped machine succeeds, terminating a machine that is gone
// succeeds. Errors are typed (see Error) so callers can tell "retry later"
// from "give up" without parsing text.
package providers

import (
	"context"
	"errors"
	"fmt"
)

// MachineState is what the provider observes, never a stored value.
type MachineState string

const (
	StateRunning MachineState = "running"
	StateStopped MachineState = "stopped"
	StatePaused  MachineState = "paused"
	// StateGone means the provider has no such machine.
	StateGone    MachineState = "gone"
	StateUnknown MachineState = "unknown"
)

// Boot is everything a machine needs to netboot into Tether.
type Boot struct {
	// Paths on the control plane host (for providers that boot locally) ...
	KernelPath    string
	InitramfsPath string
	// ... and URLs for providers that fetch over the network (iPXE).
	KernelURL    string
	InitramfsURL string
	// KernelArgs are extra arguments from the template. Enrollment data is
	// never in here; it travels in Enrollment.
	KernelArgs string
	// Signers are the template's required signer fingerprints, handed to
	// the machine as its signer anchor (fw_cfg opt/tether/signers, or
	// tether.signers= on the kernel command line).
	Signers    []string
	Enrollment Enrollment
}

// Enrollment is the per-boot identity material. Token is a secret: it must
// not be logged or written anywhere but the machine's private channel
// (fw_cfg, a per-boot iPXE script, a seed ISO).
type Enrollment struct {
	// ControlPlaneURL as the machine reaches it, e.g. https://10.0.2.2:7443.
	ControlPlaneURL string
	Token           string
	// CAFingerprint is "sha256:<hex>" over the CA certificate's DER bytes.
	CAFingerprint string
	// InstanceID is the Tether instance the boot is for. It is no secret:
	// a machine that enrolls by its TPM, with no token, names itself by it.
	InstanceID string
}

// TPMReporter is a provider that gives its machines a TPM and can say
// which: the hash of the EK (sha256:HEX) of machine id, empty when it has
// none. The instance view shows it, so an operator can bind it to the node.
type TPMReporter interface {
	TPMEKHash(id string) string
}

// Spec describes a machine to create.
type Spec struct {
	// InstanceID is Tether's id; providers name machines after it so that
	// provisioning is idempotent.
	InstanceID   string
	Region       string
	InstanceType string
	Boot         Boot
	// MAC is the hardware address of the machine's boot NIC (the node's
	// first), in lower-case colon form; empty when the node has none and
	// the provider does not netboot.
	MAC string
	// Node is the name of the instance's node. A provider whose machine
	// is fixed per node (redfish: the node's own server) finds it by this.
	Node string
}

// Machine is the provider's view of one machine.
type Machine struct {
	ID         string // provider's id (cloud_instance_id)
	InstanceID string // Tether instance id, when the provider knows it
	State      MachineState
	Addresses  []string
	Detail     string
}

// Provider creates and controls machines.
type Provider interface {
	// Name is the provider's registered name ("qemu", "external", "fake").
	Name() string
	// Provision creates and boots a machine. A second call for the same
	// InstanceID returns the existing machine.
	Provision(ctx context.Context, spec Spec) (Machine, error)
	// Start boots a stopped machine with fresh per-boot enrollment data.
	Start(ctx context.Context, id string, boot Boot) (Machine, error)
	Stop(ctx context.Context, id string) (Machine, error)
	// Reboot restarts a running machine with fresh per-boot enrollment data.
	Reboot(ctx context.Context, id string, boot Boot) (Machine, error)
	// Terminate destroys a machine and its files. A machine that is already
	// gone is success.
	Terminate(ctx context.Context, id string) error
	// Status reports the observed state. A machine the provider does not
	// know is StateGone with a nil error.
	Status(ctx context.Context, id string) (Machine, error)
	// List returns every machine the provider manages.
	List(ctx context.Context) ([]Machine, error)
}

// Netboots reports whether p boots its machines over the network.
func Netboots(p Provider) bool {
	nb, ok := p.(Netbooter)
	return ok && nb.Netboots()
}

// Kind classifies provider errors.
type Kind string

const (
	KindNotFound  Kind = "not_found"
	KindTransient Kind = "transient"
	KindQuota     Kind = "quota"
	KindPermanent Kind = "permanent"
	// KindUnsupported means the provider cannot do this at all (for example
	// stopping a machine that an external system manages).
	KindUnsupported Kind = "unsupported"
)

// Error is the one error type providers return.
type Error struct {
	Kind     Kind
	Provider string
	Op       string
	Err      error
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s %s: %s: %v", e.Provider, e.Op, e.Kind, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf builds a typed provider error.
func Errorf(kind Kind, provider, op, format string, args ...any) error {
	return &Error{Kind: kind, Provider: provider, Op: op, Err: fmt.Errorf(format, args...)}
}

// MachineError is the typed error of one provider operation on machine id
// (id may be empty), so every provider names the machine the same way.
func MachineError(kind Kind, provider, op, id string, err error) error {
	if id != "" {
		err = fmt.Errorf("%s: %w", id, err)
	}
	return &Error{Kind: kind, Provider: provider, Op: op, Err: err}
}

// KindOf returns the kind of a provider error; untyped errors count as
// transient because a retry is the safe default for an unknown failure.
func KindOf(err error) Kind {
	var pe *Error
	if errors.As(err, &pe) {
		return pe.Kind
	}
	return KindTransient
}

// IsNotFound reports whether err means the machine does not exist.
func IsNotFound(err error) bool { return err != nil && KindOf(err) == KindNotFound }
