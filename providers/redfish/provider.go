// Package redfish is the provider for bare-metal machines driven through
// their BMC's Redfish service: a one-time PXE boot override and power on
// (or a forced restart) to provision and start, a graceful shutdown with a
// forced one after a timeout to stop, a graceful restart to reboot, power
// off and the override cleared to terminate, and status from PowerState.
// The machine then netboots through the control plane's netboot server,
// bound to its node by MAC (providers.Netbooter).
//
// A machine is a node: its id is "redfish:<node name>". The provider keeps
// nothing; it asks a Resolver (the control plane, over its store) for the
// node's BMC address, credentials and TLS policy on every call, so a
// rotated password or a moved BMC takes effect at once and the password is
// held only for the length of a call.
package redfish

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/providers"
)

// Name is the provider's registered name.
const Name = "redfish"

// IDPrefix starts every machine id: redfish:<node name>.
const IDPrefix = "redfish:"

// MachineID is the id of a node's machine.
func MachineID(node string) string { return IDPrefix + node }

// Target is everything needed to drive one node's BMC.
type Target struct {
	Node string
	// Address is redfish://HOST[:PORT]/redfish/v1/Systems/ID.
	Address  string
	Username string
	// Password is a secret: it goes into the Authorization header and
	// nowhere else.
	Password string
	TLS      TLS
	// BootMode is the override mode: ModeUEFI, ModeLegacy, or "" to
	// leave the BMC's.
	BootMode string
	// InstanceID is the live instance that recorded this machine, if any.
	InstanceID string
}

// Resolver finds nodes' BMCs. An unknown node, or one without a redfish
// BMC, is an error wrapping ErrNoBMC.
type Resolver interface {
	Target(ctx context.Context, node string) (Target, error)
	// Targets lists every node with a redfish BMC.
	Targets(ctx context.Context) ([]Target, error)
}

// ErrNoBMC means the node does not exist or names no redfish BMC.
var ErrNoBMC = errors.New("no redfish BMC")

// ErrMisconfigured means the node's BMC settings cannot be used as they
// are (a missing credential, one that cannot be opened): an operator must
// fix them, and retrying will not.
var ErrMisconfigured = errors.New("BMC settings unusable")

// Config configures the provider. Zero durations take the defaults.
type Config struct {
	Resolver Resolver
	Clock    clock.Clock
	Logger   *slog.Logger
	// GracefulTimeout is how long Stop waits for a graceful shutdown
	// before forcing the power off (default 60 s).
	GracefulTimeout time.Duration
	// PowerTimeout is how long an action waits for PowerState to show
	// its effect (default 60 s).
	PowerTimeout time.Duration
	// PollInterval is how often PowerState is read while waiting (default 1 s).
	PollInterval time.Duration
	// RequestTimeout bounds a connection, a TLS handshake and the wait
	// for an answer's headers (default 15 s).
	RequestTimeout time.Duration
	// Warn is told of every use of a BMC whose TLS is not verified
	// (the control plane writes a warning event).
	Warn func(ctx context.Context, node, message string)
}

// Provider is the redfish provider.
type Provider struct {
	cfg Config
}

var (
	_ providers.Provider  = (*Provider)(nil)
	_ providers.Netbooter = (*Provider)(nil)
)

// New returns the provider.
func New(cfg Config) (*Provider, error) {
	if cfg.Resolver == nil {
		return nil, errors.New("redfish: a Resolver is required")
	}
	if cfg.GracefulTimeout < 0 || cfg.PowerTimeout < 0 || cfg.PollInterval < 0 || cfg.RequestTimeout < 0 {
		return nil, errors.New("redfish: negative duration in config")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.GracefulTimeout == 0 {
		cfg.GracefulTimeout = 60 * time.Second
	}
	if cfg.PowerTimeout == 0 {
		cfg.PowerTimeout = 60 * time.Second
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = 15 * time.Second
	}
	return &Provider{cfg: cfg}, nil
}

// Name implements providers.Provider.
func (*Provider) Name() string { return Name }

// Netboots implements providers.Netbooter: the machine's firmware boots
// from the network, so it gets its per-boot script (and token) by MAC.
func (*Provider) Netboots() bool { return true }

// MachinesAreNodes implements providers.NodeHardware: the machine is the
// server behind the node's BMC.
func (*Provider) MachinesAreNodes() bool { return true }

// session is one call's connection to a node's system.
type session struct {
	node string
	host string
	c    *Client
	sys  *System
	t    Target
}

func nodeOf(op, id string) (string, error) {
	node, ok := strings.CutPrefix(id, IDPrefix)
	if !ok || node == "" {
		return "", providers.Errorf(providers.KindNotFound, Name, op, "machine id %q is not a redfish machine (want %s<node>)", id, IDPrefix)
	}
	return node, nil
}

// open resolves the node's BMC and finds its system.
func (p *Provider) open(ctx context.Context, op, node string) (*session, error) {
	t, err := p.cfg.Resolver.Target(ctx, node)
	if err != nil {
		if errors.Is(err, ErrNoBMC) {
			return nil, &providers.Error{Kind: providers.KindNotFound, Provider: Name, Op: op, Err: err}
		}
		if errors.Is(err, ErrMisconfigured) {
			return nil, &providers.Error{Kind: providers.KindPermanent, Provider: Name, Op: op, Err: err}
		}
		return nil, &providers.Error{Kind: providers.KindTransient, Provider: Name, Op: op, Err: fmt.Errorf("node %s: look up its BMC: %w", node, err)}
	}
	ep, err := ParseEndpoint(t.Address)
	if err != nil {
		return nil, providers.Errorf(providers.KindPermanent, Name, op, "node %s: %v", node, err)
	}
	cfg, err := t.TLS.Config(ep.Base.Hostname())
	if err != nil {
		return nil, providers.Errorf(providers.KindPermanent, Name, op, "node %s: BMC TLS: %v", node, err)
	}
	if t.TLS.InsecureSkipVerify {
		msg := fmt.Sprintf("node %s: the BMC at %s is used with TLS verification off (--bmc-insecure-skip-verify): anyone on the path can read its credentials", node, ep.Base.Host)
		p.cfg.Logger.Warn("BMC TLS not verified", "node", node, "bmc", ep.Base.Host, "op", op)
		if p.cfg.Warn != nil {
			p.cfg.Warn(ctx, node, msg)
		}
	}
	s := &session{node: node, host: ep.Base.Host, t: t,
		c: NewClient(ep.Base, httpClient(cfg, p.cfg.RequestTimeout), t.Username, t.Password)}
	if s.sys, err = s.c.FindSystem(ctx, ep.SystemPath); err != nil {
		return nil, p.classify(op, s, err)
	}
	return s, nil
}

// classify maps a BMC failure onto a provider error kind, in words an
// operator can act on.
func (p *Provider) classify(op string, s *session, err error) error {
	if err == nil {
		return nil
	}
	var he *HTTPError
	var pe *providers.Error
	var uae x509.UnknownAuthorityError
	var hne x509.HostnameError
	var cve *tls.CertificateVerificationError
	var ie x509.CertificateInvalidError
	kind := providers.KindTransient
	switch {
	case errors.As(err, &pe):
		return err
	case errors.As(err, &he) && (he.Status == http.StatusUnauthorized || he.Status == http.StatusForbidden):
		kind = providers.KindPermanent
		err = fmt.Errorf("BMC credentials refused for node %s (user %q at %s): %w", s.node, s.t.Username, s.host, err)
	case errors.As(err, &he) && he.Status == http.StatusNotFound:
		kind = providers.KindNotFound
		err = fmt.Errorf("node %s: %w", s.node, err)
	case errors.As(err, &he) && (he.Status >= 500 || he.Status == http.StatusTooManyRequests || he.Status == http.StatusRequestTimeout):
		err = fmt.Errorf("node %s: %w", s.node, err)
	case errors.As(err, &he):
		kind = providers.KindPermanent
		err = fmt.Errorf("node %s: the BMC refused: %w", s.node, err)
	case errors.As(err, &uae), errors.As(err, &hne), errors.As(err, &cve), errors.As(err, &ie), errors.Is(err, errPinMismatch):
		kind = providers.KindPermanent
		err = fmt.Errorf("node %s: the BMC's TLS certificate is not trusted (set --bmc-ca or --bmc-fingerprint): %w", s.node, err)
	default:
		err = fmt.Errorf("node %s: %w", s.node, err)
	}
	return &providers.Error{Kind: kind, Provider: Name, Op: op, Err: err}
}

// state maps PowerState onto what the control plane observes. A machine
// powering on is running (it is booting, as a VM just launched is); one
// powering off is not stopped yet.
func state(ps PowerState) providers.MachineState {
	switch ps {
	case PowerOn, PowerPoweringOn:
		return providers.StateRunning
	case PowerOff:
		return providers.StateStopped
	case PowerPaused:
		return providers.StatePaused
	}
	return providers.StateUnknown
}

func (s *session) machine(instanceID string) providers.Machine {
	return providers.Machine{ID: MachineID(s.node), InstanceID: instanceID, State: state(s.sys.PowerState),
		Detail: fmt.Sprintf("BMC %s system %s: PowerState %s", s.host, s.sys.ODataID, orUnknown(string(s.sys.PowerState)))}
}

func orUnknown(s string) string {
	if s == "" {
		return "(not reported)"
	}
	return s
}

// Provision sets the node's machine to netboot once and powers it on, or
// restarts it if it was on, so that it boots into Tether.
func (p *Provider) Provision(ctx context.Context, spec providers.Spec) (providers.Machine, error) {
	if spec.InstanceID == "" {
		return providers.Machine{}, providers.Errorf(providers.KindPermanent, Name, "provision", "instance id is required")
	}
	if spec.Node == "" {
		return providers.Machine{}, providers.Errorf(providers.KindPermanent, Name, "provision", "instance %s: no node given; a redfish machine is its node's", spec.InstanceID)
	}
	s, err := p.open(ctx, "provision", spec.Node)
	if err != nil {
		return providers.Machine{}, err
	}
	if err := p.netboot(ctx, "provision", s); err != nil {
		return providers.Machine{}, err
	}
	return s.machine(spec.InstanceID), nil
}

// Start netboots a stopped machine; its fresh token comes with its
// per-boot script, so boot carries nothing the BMC needs.
func (p *Provider) Start(ctx context.Context, id string, _ providers.Boot) (providers.Machine, error) {
	return p.withSession(ctx, "start", id, func(s *session) error { return p.netboot(ctx, "start", s) })
}

// Reboot sets the one-time PXE override and restarts gracefully (powers
// on a machine found off).
func (p *Provider) Reboot(ctx context.Context, id string, _ providers.Boot) (providers.Machine, error) {
	return p.withSession(ctx, "reboot", id, func(s *session) error {
		if err := p.override(ctx, "reboot", s); err != nil {
			return err
		}
		if s.sys.PowerState == PowerOff {
			return p.power(ctx, "reboot", s, []ResetType{ResetOn, ResetForceOn, ResetPushPowerButton}, p.cfg.PowerTimeout, PowerOn, PowerPoweringOn)
		}
		return p.restart(ctx, "reboot", s, ResetGracefulRestart, ResetForceRestart)
	})
}

// Stop shuts the machine down gracefully and forces the power off if it
// is still on after GracefulTimeout.
func (p *Provider) Stop(ctx context.Context, id string) (providers.Machine, error) {
	return p.withSession(ctx, "stop", id, func(s *session) error {
		if s.sys.PowerState == PowerOff {
			return nil
		}
		types, err := s.c.ResetTypes(ctx, s.sys)
		if err != nil {
			return p.classify("stop", s, err)
		}
		if Allows(types, ResetGracefulShutdown) {
			err := p.power(ctx, "stop", s, []ResetType{ResetGracefulShutdown}, p.cfg.GracefulTimeout, PowerOff)
			if err == nil {
				return nil
			}
			if !errors.Is(err, errTimeout) {
				return err
			}
			p.cfg.Logger.Warn("graceful shutdown did not power the machine off in time; forcing it off", "node", s.node, "after", p.cfg.GracefulTimeout)
		}
		return p.power(ctx, "stop", s, []ResetType{ResetForceOff, ResetPushPowerButton}, p.cfg.PowerTimeout, PowerOff)
	})
}

// Terminate powers the machine off and clears the boot override. A node
// that no longer names a BMC has no machine to terminate.
func (p *Provider) Terminate(ctx context.Context, id string) error {
	_, err := p.withSession(ctx, "terminate", id, func(s *session) error {
		if s.sys.PowerState != PowerOff {
			if err := p.power(ctx, "terminate", s, []ResetType{ResetForceOff, ResetPushPowerButton}, p.cfg.PowerTimeout, PowerOff); err != nil {
				return err
			}
		}
		return p.patchBoot(ctx, "terminate", s, BootPatch{BootSourceOverrideEnabled: OverrideDisabled}, func(b Boot) bool {
			return b.BootSourceOverrideEnabled == OverrideDisabled
		})
	})
	if providers.IsNotFound(err) {
		return nil
	}
	return err
}

// Status reads PowerState. A node without a BMC is gone.
func (p *Provider) Status(ctx context.Context, id string) (providers.Machine, error) {
	node, err := nodeOf("status", id)
	if err != nil {
		return providers.Machine{ID: id, State: providers.StateGone}, nil
	}
	s, err := p.open(ctx, "status", node)
	if errors.Is(err, ErrNoBMC) {
		return providers.Machine{ID: id, State: providers.StateGone, Detail: err.Error()}, nil
	}
	if err != nil {
		return providers.Machine{}, err
	}
	return s.machine(s.t.InstanceID), nil
}

// List reads every node's PowerState. A BMC that cannot be read is
// listed as unknown, not left out: a missing machine would tell provider
// sync it is gone, and one silent BMC would stop sync for the whole rack
// if it failed the list.
func (p *Provider) List(ctx context.Context) ([]providers.Machine, error) {
	ts, err := p.cfg.Resolver.Targets(ctx)
	if err != nil {
		return nil, &providers.Error{Kind: providers.KindTransient, Provider: Name, Op: "list", Err: fmt.Errorf("look up BMCs: %w", err)}
	}
	out := make([]providers.Machine, 0, len(ts))
	for _, t := range ts {
		s, err := p.open(ctx, "list", t.Node)
		if err != nil {
			out = append(out, providers.Machine{ID: MachineID(t.Node), InstanceID: t.InstanceID, State: providers.StateUnknown, Detail: err.Error()})
			continue
		}
		out = append(out, s.machine(t.InstanceID))
	}
	return out, nil
}

func (p *Provider) withSession(ctx context.Context, op, id string, fn func(*session) error) (providers.Machine, error) {
	node, err := nodeOf(op, id)
	if err != nil {
		return providers.Machine{}, err
	}
	s, err := p.open(ctx, op, node)
	if err != nil {
		return providers.Machine{}, err
	}
	if err := fn(s); err != nil {
		return providers.Machine{}, err
	}
	return s.machine(s.t.InstanceID), nil
}

// netboot sets the one-time PXE override, then powers the machine on, or
// restarts it if it is on, so that its next boot is from the network.
func (p *Provider) netboot(ctx context.Context, op string, s *session) error {
	if err := p.override(ctx, op, s); err != nil {
		return err
	}
	if s.sys.PowerState == PowerOn || s.sys.PowerState == PowerPoweringOn {
		return p.restart(ctx, op, s, ResetForceRestart)
	}
	return p.power(ctx, op, s, []ResetType{ResetOn, ResetForceOn, ResetPushPowerButton}, p.cfg.PowerTimeout, PowerOn, PowerPoweringOn)
}

// override sets BootSourceOverrideEnabled=Once, Target=Pxe and the node's mode.
func (p *Provider) override(ctx context.Context, op string, s *session) error {
	want := BootPatch{BootSourceOverrideEnabled: OverrideOnce, BootSourceOverrideTarget: TargetPxe, BootSourceOverrideMode: s.t.BootMode}
	if ts := s.sys.Boot.AllowableTargets; len(ts) > 0 && !contains(ts, TargetPxe) {
		return providers.Errorf(providers.KindPermanent, Name, op, "node %s: the BMC offers no Pxe boot override (it allows %s)", s.node, strings.Join(ts, ", "))
	}
	return p.patchBoot(ctx, op, s, want, func(b Boot) bool {
		return b.BootSourceOverrideEnabled == want.BootSourceOverrideEnabled && b.BootSourceOverrideTarget == want.BootSourceOverrideTarget &&
			(want.BootSourceOverrideMode == "" || b.BootSourceOverrideMode == want.BootSourceOverrideMode)
	})
}

// patchBoot PATCHes Boot. A PATCH whose answer was lost is judged by
// reading Boot back: done means it took effect.
func (p *Provider) patchBoot(ctx context.Context, op string, s *session, b BootPatch, done func(Boot) bool) error {
	err := s.c.PatchBoot(ctx, s.sys, b)
	var se *SentError
	if errors.As(err, &se) {
		if sys, rerr := s.c.System(ctx, s.sys.ODataID); rerr == nil && done(sys.Boot) {
			p.cfg.Logger.Warn("BMC's answer to a boot override was lost, but the override is set", "node", s.node, "op", op, "err", err)
			s.sys, err = sys, nil
		}
	}
	if err != nil {
		return p.classify(op, s, err)
	}
	return nil
}

// restart posts the first allowed of types (it cannot be observed, so an
// answer that was lost stays an error, naming what was seen).
func (p *Provider) restart(ctx context.Context, op string, s *session, types ...ResetType) error {
	allowed, err := s.c.ResetTypes(ctx, s.sys)
	if err != nil {
		return p.classify(op, s, err)
	}
	t, ok := first(allowed, types)
	if !ok {
		return providers.Errorf(providers.KindPermanent, Name, op, "node %s: the BMC offers none of %v (it allows %v)", s.node, types, allowed)
	}
	if err := s.c.Reset(ctx, s.sys, t); err != nil {
		var se *SentError
		if errors.As(err, &se) {
			if sys, rerr := s.c.System(ctx, s.sys.ODataID); rerr == nil {
				err = fmt.Errorf("%w (now PowerState %s; whether it restarted cannot be told)", err, orUnknown(string(sys.PowerState)))
			}
		}
		return p.classify(op, s, err)
	}
	sys, err := p.wait(ctx, s, p.cfg.PowerTimeout, PowerOn, PowerPoweringOn)
	if err != nil {
		return p.classify(op, s, err)
	}
	s.sys = sys
	return nil
}

// errTimeout is a PowerState that did not reach what an action aims at.
var errTimeout = errors.New("timed out")

// errPinMismatch is a BMC certificate that is not the pinned one.
var errPinMismatch = errors.New("certificate does not match the pinned fingerprint")

// power posts the first allowed of types, then waits up to timeout for
// PowerState to be one of want. An action whose answer was lost is judged
// by PowerState: reaching want means it acted.
func (p *Provider) power(ctx context.Context, op string, s *session, types []ResetType, timeout time.Duration, want ...PowerState) error {
	allowed, err := s.c.ResetTypes(ctx, s.sys)
	if err != nil {
		return p.classify(op, s, err)
	}
	t, ok := first(allowed, types)
	if !ok {
		return providers.Errorf(providers.KindPermanent, Name, op, "node %s: the BMC offers none of %v (it allows %v)", s.node, types, allowed)
	}
	rerr := s.c.Reset(ctx, s.sys, t)
	var se *SentError
	if rerr != nil && !errors.As(rerr, &se) {
		return p.classify(op, s, rerr)
	}
	sys, werr := p.wait(ctx, s, timeout, want...)
	if werr == nil {
		if rerr != nil {
			p.cfg.Logger.Warn("BMC's answer to a reset was lost, but PowerState shows it acted", "node", s.node, "op", op, "reset", t, "err", rerr)
		}
		s.sys = sys
		return nil
	}
	if rerr != nil {
		return p.classify(op, s, fmt.Errorf("%w; then %v", rerr, werr))
	}
	if errors.Is(werr, errTimeout) {
		return &providers.Error{Kind: providers.KindTransient, Provider: Name, Op: op, Err: fmt.Errorf("node %s: %w", s.node, werr)}
	}
	return p.classify(op, s, werr)
}

// wait polls PowerState until it is one of want or timeout passes.
func (p *Provider) wait(ctx context.Context, s *session, timeout time.Duration, want ...PowerState) (*System, error) {
	deadline := p.cfg.Clock.Now().Add(timeout)
	var last PowerState
	for {
		sys, err := s.c.System(ctx, s.sys.ODataID)
		if err == nil {
			if contains(want, sys.PowerState) {
				return sys, nil
			}
			last = sys.PowerState
		}
		if !p.cfg.Clock.Now().Before(deadline) {
			if err != nil {
				return nil, err
			}
			return nil, fmt.Errorf("PowerState is %s, not %v, after %s: %w", orUnknown(string(last)), want, timeout, errTimeout)
		}
		t := p.cfg.Clock.NewTimer(p.cfg.PollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("waiting for PowerState %v (last %s): %w", want, orUnknown(string(last)), ctx.Err())
		case <-t.C():
		}
	}
}

func first(allowed, prefs []ResetType) (ResetType, bool) {
	for _, t := range prefs {
		if Allows(allowed, t) {
			return t, true
		}
	}
	return "", false
}

func contains[T comparable](xs []T, x T) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}
