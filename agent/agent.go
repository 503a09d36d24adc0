// Package agent is the node agent's orchestrator. Run takes a node from
// nothing to ready: discover the enrollment material, enroll (or reuse the
// identity saved by this boot's first agent), open the Connect stream so the
// control plane watches every phase live, pull and verify the root layers,
// and, in switch mode, compose the root and switch into it. Every step that
// touches the machine sits behind an interface (BootSetup, RootSwitcher,
// tasks.Power), so tests run whole agents in-process.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/agent/enroll"
	"github.com/tetherfleet/tether/agent/identity"
	"github.com/tetherfleet/tether/agent/memcheck"
	"github.com/tetherfleet/tether/agent/modules"
	"github.com/tetherfleet/tether/agent/session"
	"github.com/tetherfleet/tether/agent/tasks"
	"github.com/tetherfleet/tether/internal/clock"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// RootMode says whether the agent switches into the composed root.
type RootMode string

const (
	// RootModeSwitch composes the root from the layers and switches into
	// it (the agent is PID 1 in an initramfs).
	RootModeSwitch RootMode = "switch"
	// RootModeNone verifies the layers and reports ready without touching
	// the machine: the agent after the switch of root, or one run by hand.
	RootModeNone RootMode = "none"
)

// DefaultStateDir survives the switch of root: /run is moved into it.
const DefaultStateDir = "/run/tether"

// Config configures an agent. Only the zero value's defaults touch the real
// machine; a test sets StateDir, DialOptions, Sources and the interfaces.
type Config struct {
	// Explicit enrollment material (flags); empty fields are discovered.
	ControlPlane string
	Token        string
	CASHA256     string
	// Instance names the instance of a tokenless, TPM-attested boot.
	Instance string

	StateDir string   // default /run/tether
	RootMode RootMode // default switch when PID1, else none
	// PID1 is set when the agent is the initramfs's init: it then runs
	// BootSetup, reaps orphans and must never exit (see Supervise).
	PID1 bool
	// AllowPower lets reboot and poweroff tasks act in root mode none.
	AllowPower bool
	Version    string

	// Sources are consulted in order (default identity.DefaultSources()).
	Sources []identity.Source
	// CmdlinePath is read for tether.debug (default /proc/cmdline).
	CmdlinePath string
	// Anchor says where the node's signer anchor is read from (default:
	// the kernel command line at CmdlinePath, fw_cfg, /etc/tether/signers).
	Anchor identity.AnchorSources

	// Console receives the operator-facing lines (default os.Stderr).
	Console io.Writer
	Clock   clock.Clock
	// Rand drives the backoff jitter (default: seeded from the system).
	Rand *rand.Rand
	// DialOptions are added to every connection (tests inject dialers).
	DialOptions []grpc.DialOption

	Boot BootSetup
	Root RootSwitcher
	// RootTarget is where the new root is composed (default /newroot), and
	// RootWorkDir holds the layer mounts and the writable layer (default
	// StateDir/rootfs, under /run so they move into the new root with it).
	RootTarget  string
	RootWorkDir string
	// Extensions attaches extension modules at StateDir/ext/<name> on the
	// node's own root (nil: they are fetched and verified, not attached).
	Extensions ExtensionMounter
	// Power acts on reboot and poweroff tasks. Default: the real one when
	// the agent runs the node (switch mode, after this boot's switch, or
	// with AllowPower), a dry run otherwise.
	Power tasks.Power

	// PowerButtons, when set, is the sysfs input class (/sys/class/input)
	// searched for the ACPI power button; a press powers the node off the
	// way a poweroff task does, so a provider's graceful stop is graceful.
	// Empty: no watch (tests, an agent run by hand).
	PowerButtons string

	// MemInfo is read before a switch-mode fetch to check that the node's
	// memory holds the modules (default /proc/meminfo); MemoryMargin is
	// what must be left over (default memcheck.DefaultMargin).
	MemInfo      string
	MemoryMargin uint64

	// RunDir is the /run that the switch moves into the new root, where a
	// systemd root's unit for the agent is written (default /run).
	RunDir string

	// OnPhase is told about every phase change (tests, metrics).
	OnPhase func(tetherv1.AgentPhase)
	// BootID defaults to the kernel's per-boot id (read after BootSetup,
	// once /proc is mounted).
	BootID    string
	Uptime    func() time.Duration
	Addresses func() []string
	// Notifier defaults to sd_notify (a no-op without NOTIFY_SOCKET).
	Notifier Notifier
	// ConnGrace is how long an old connection lives after a renewal
	// (default 1 minute).
	ConnGrace time.Duration

	// OpenTPM opens the machine's TPM for a tokenless, attested
	// enrollment (default: agent/tpm at /dev/tpmrm0). It returns an
	// error wrapping tpm.ErrNoTPM when the machine has none.
	OpenTPM func() (AttesterCloser, error)
}

func (c *Config) defaults() error {
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	switch c.RootMode {
	case "":
		c.RootMode = RootModeNone
		if c.PID1 {
			c.RootMode = RootModeSwitch
		}
	case RootModeSwitch, RootModeNone:
	default:
		return fmt.Errorf("root mode %q: want switch or none", c.RootMode)
	}
	if c.Sources == nil {
		c.Sources = identity.DefaultSources()
	}
	if c.Console == nil {
		c.Console = os.Stderr
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Rand == nil {
		c.Rand = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	if c.RootTarget == "" {
		c.RootTarget = "/newroot"
	}
	if c.RunDir == "" {
		c.RunDir = "/run"
	}
	if c.MemInfo == "" {
		c.MemInfo = "/proc/meminfo"
	}
	if c.MemoryMargin == 0 {
		c.MemoryMargin = memcheck.DefaultMargin
	}
	if c.RootWorkDir == "" {
		c.RootWorkDir = filepath.Join(c.StateDir, "rootfs")
	}
	if c.Uptime == nil {
		c.Uptime = systemUptime
	}
	if c.Addresses == nil {
		c.Addresses = localAddresses
	}
	if c.Notifier == nil {
		c.Notifier = systemdNotifier{}
	}
	if c.ConnGrace == 0 {
		c.ConnGrace = time.Minute
	}
	if c.Version == "" {
		c.Version = "dev"
	}
	return nil
}

type agent struct {
	cfg     Config
	con     *console
	status  *session.Status
	backoff session.Backoff
	procs   *tasks.Registry
	// st is this boot's saved state (agent.json in the state dir).
	st savedState
	// policy holds the node's signer anchor, read once at start.
	policy modules.Policy
}

// Run takes the node to ready and then serves the control plane until ctx
// ends (it returns nil then). It returns an error for a failure it cannot
// retry away, with a message that says what to do. Transient failures
// (control plane unreachable) are retried with backoff, forever.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.defaults(); err != nil {
		return err
	}
	a := &agent{
		cfg:     cfg,
		con:     &console{w: cfg.Console, now: cfg.Clock.Now},
		status:  session.NewStatus(),
		backoff: session.DefaultBackoff(cfg.Rand),
		procs:   tasks.NewRegistry(),
	}
	err := a.run(ctx)
	if err != nil && ctx.Err() != nil {
		return nil
	}
	return err
}

func (a *agent) setPhase(p tetherv1.AgentPhase) {
	if a.status.Phase() != p || p == tetherv1.AgentPhase_AGENT_PHASE_DISCOVERING {
		a.con.Printf("phase %s", phaseName(p))
	}
	a.status.SetPhase(p)
	if a.cfg.OnPhase != nil {
		a.cfg.OnPhase(p)
	}
}

// phaseName is how the console names a phase: "pulling".
func phaseName(p tetherv1.AgentPhase) string {
	return strings.ToLower(strings.TrimPrefix(p.String(), "AGENT_PHASE_"))
}

func (a *agent) run(ctx context.Context) error {
	cfg := a.cfg
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// The kernel's clock lines this up with the kernel's own console
	// stamps: the time from "Run /init" to here is the agent's start-up.
	a.con.Printf("tether-agent %s starting as pid %d (root mode %s, state in %s, kernel up %s)", cfg.Version, os.Getpid(), cfg.RootMode, cfg.StateDir, bootClock().Round(time.Millisecond))
	a.setPhase(tetherv1.AgentPhase_AGENT_PHASE_DISCOVERING)
	if cfg.PID1 {
		wg.Add(1)
		go func() { defer wg.Done(); reapOrphans(ctx, a.procs) }()
		if cfg.Boot != nil {
			if err := cfg.Boot.Setup(ctx, a.con.Printf); err != nil {
				return fmt.Errorf("boot setup: %w", err)
			}
		}
	}

	if a.cfg.BootID == "" {
		a.cfg.BootID = kernelBootID()
	}
	cfg = a.cfg
	loaded, err := loadState(cfg.StateDir)
	if err != nil {
		a.con.Printf("ignoring unreadable %s: %v (delete it if this repeats)", filepath.Join(cfg.StateDir, stateFile), err)
		loaded = savedState{}
	}
	a.st = loaded
	st := &a.st
	successor := st.Switched && st.BootID == cfg.BootID

	explicit := identity.Fields{URL: cfg.ControlPlane, Token: cfg.Token, CA: cfg.CASHA256, Instance: cfg.Instance}
	disc, err := identity.Discover(ctx, explicit, cfg.Sources...)
	if err != nil {
		return fmt.Errorf("discover enrollment material: %w", err)
	}
	for _, w := range disc.Warnings {
		a.con.Printf("%s", w)
	}
	if disc.URL == "" && st.URL != "" {
		disc.URL, disc.From["url"] = st.URL, "saved state"
	}
	if disc.CA == "" && st.CA != "" {
		disc.CA, disc.From["ca"] = st.CA, "saved state"
	}
	if err := disc.Require(false); err != nil {
		return err
	}
	a.con.Printf("control plane %s, CA pinned to %s (%s)", disc.URL, disc.CA, disc.Summary())
	anchorSrc := cfg.Anchor
	if anchorSrc.CmdlinePath == "" {
		anchorSrc.CmdlinePath = cfg.CmdlinePath
	}
	anchor, err := identity.DiscoverAnchor(anchorSrc)
	if err != nil {
		return fmt.Errorf("signer anchor: %w (a node with a damaged anchor boots nothing)", err)
	}
	a.policy = modules.Policy{Anchors: anchor.Signers}
	a.con.Printf("%s", anchor)

	mgr, err := enroll.New(enroll.Config{
		StateDir: cfg.StateDir, URL: disc.URL, CAFingerprint: disc.CA, Clock: cfg.Clock,
		DialOptions: cfg.DialOptions, Logf: a.con.Printf, Delay: a.backoff.Delay,
	})
	if err != nil {
		return err
	}
	id, err := mgr.Load()
	switch {
	case err == nil && !id.Expired(cfg.Clock.Now()):
		a.con.Printf("reusing the saved identity: instance %s (certificate valid until %s)", id.InstanceID, stamp(id.Cert.NotAfter))
	case err == nil:
	case errors.Is(err, enroll.ErrNoIdentity):
		id = nil
	default:
		a.con.Printf("the saved identity is unusable (%v); enrolling afresh", err)
		id = nil
	}
	if id == nil {
		if id, err = a.enroll(ctx, mgr, disc); err != nil {
			return err
		}
	}
	st.BootID, st.URL, st.CA = cfg.BootID, disc.URL, disc.CA
	if !successor {
		st.Switched, st.Modules, st.Extensions = false, nil, nil
	}
	if err := saveState(cfg.StateDir, *st); err != nil {
		return fmt.Errorf("save agent state in %s: %w", cfg.StateDir, err)
	}

	conns, err := newConnHolder(mgr, cfg.ConnGrace)
	if err != nil {
		return err
	}
	// Stop everything that uses the connection before closing it, so a
	// shutdown does not print a lost stream.
	defer func() {
		cancel()
		wg.Wait()
		conns.Close()
	}()
	tokens := func(ctx context.Context) (string, error) {
		d, err := identity.Discover(ctx, explicit, cfg.Sources...)
		return d.Token, err
	}
	if id.Expired(cfg.Clock.Now()) {
		a.setPhase(tetherv1.AgentPhase_AGENT_PHASE_ENROLLING)
		if err := mgr.Recover(ctx, conns.Client, tokens); err != nil {
			return err
		}
		// The connection may have failed its handshake with the expired
		// certificate and be backing off; start afresh with the new one.
		if err := conns.redial(); err != nil {
			return err
		}
		id = mgr.Current()
	}

	var sessMu sync.Mutex
	var sess *session.Session
	// The session outlives ctx by its goodbye (below): a stop (systemd's
	// SIGTERM at poweroff) must not cut the stream before the last
	// heartbeat and every queued task update are read. Its tasks are
	// cancelled once the goodbye is over, before the deferred wg.Wait.
	sessCtx, cancelSess := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelSess()
	// startSession opens the Connect stream. It runs again if the stream was
	// closed for a switch of root that then found no init to hand over to.
	startSession := func() *session.Session {
		s := session.New(session.Config{
			Client:    conns.Client,
			Status:    a.status,
			Runner:    a.executor(mgr, conns, successor),
			Clock:     cfg.Clock,
			Backoff:   a.backoff,
			Version:   cfg.Version,
			BootID:    cfg.BootID,
			Uptime:    cfg.Uptime,
			Addresses: cfg.Addresses,
			Logf:      a.con.Printf,
			// A CA rotation's bundle: trusted once it chains to the pin.
			OnTrustBundle: mgr.ApplyBundle,
		})
		sessMu.Lock()
		sess = s
		sessMu.Unlock()
		wg.Add(1)
		go func() { defer wg.Done(); a.reportEnd(ctx, "the control plane session", s.Run(sessCtx)) }()
		return s
	}
	current := func() *session.Session {
		sessMu.Lock()
		defer sessMu.Unlock()
		return sess
	}
	startSession()
	changed := mgr.Subscribe()
	wg.Add(3)
	go func() {
		defer wg.Done()
		a.reportEnd(ctx, "certificate maintenance (renewal and recovery)", mgr.Maintain(ctx, conns.Client, tokens))
	}()
	go func() { defer wg.Done(); pingWatchdog(ctx, cfg.Notifier) }()
	go func() {
		defer wg.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case <-changed:
				if err := conns.redial(); err != nil {
					a.con.Printf("reconnecting with the renewed certificate failed: %v; the old connection stays in use", err)
					continue
				}
				current().Reconnect()
			}
		}
	}()

	if cfg.PowerButtons != "" {
		wg.Add(1)
		go func() { defer wg.Done(); a.watchPowerButton(ctx, a.power(successor)) }()
	}
	if successor {
		a.reportModules()
		a.con.Printf("running on the root this boot's first agent composed (%d root layers verified before the switch)", len(st.Modules))
	} else if err := a.bringUp(ctx, conns, current(), startSession, st); err != nil {
		return a.fail(ctx, current(), err)
	}
	if a.attaching() {
		asg, err := a.assignment(ctx, conns)
		if err != nil {
			return a.fail(ctx, current(), err)
		}
		if _, err := a.syncExtensions(ctx, conns, asg); err != nil {
			return a.fail(ctx, current(), err)
		}
	}
	a.con.Printf("ready: instance %s, agent %s, boot %s", id.InstanceID, cfg.Version, cfg.BootID)
	a.setPhase(tetherv1.AgentPhase_AGENT_PHASE_READY)
	if err := cfg.Notifier.Notify("READY=1"); err != nil {
		a.con.Printf("telling the service manager we are ready failed: %v", err)
	}
	<-ctx.Done()
	a.goodbye(current())
	return nil
}

// goodbyeTimeout bounds each half of the goodbye; with both it stays well
// inside the unit's TimeoutStopSec (handover.Unit).
const goodbyeTimeout = 3 * time.Second

// goodbye ends the session cleanly when the agent is stopped: the last
// heartbeat goes out, and the half-closed stream is drained, so the
// control plane has read everything (the result of a task that ran
// `systemctl poweroff`, say) and sees an orderly end, not a cut.
func (a *agent) goodbye(sess *session.Session) {
	if !sess.Connected() {
		a.con.Printf("stopping: no stream to the control plane is open; nothing more to report")
		sess.Close(0)
		return
	}
	sent := sess.WaitSent(context.Background(), goodbyeTimeout)
	if sess.Close(goodbyeTimeout) && sent {
		a.con.Printf("stopping: the last heartbeat was read by the control plane")
		return
	}
	a.con.Printf("stopping: the control plane did not confirm the last heartbeat within %s", goodbyeTimeout)
}

// reportEnd says on the console why a background part of the agent
// stopped before the agent did: it no longer does its job (a session that
// ended no longer reports, maintenance that ended no longer renews).
func (a *agent) reportEnd(ctx context.Context, what string, err error) {
	if err == nil || ctx.Err() != nil {
		return
	}
	a.status.SetError(fmt.Errorf("%s stopped: %w", what, err))
	a.con.Printf("%s stopped: %v; restart the agent (or reboot the node) to get it back", what, err)
}

// fail reports err in a heartbeat before the agent gives up on this run,
// so the control plane shows why the boot stopped.
func (a *agent) fail(ctx context.Context, sess *session.Session, err error) error {
	if ctx.Err() != nil {
		// Stopped mid-way: the cancellation is no fault of the boot, and
		// reporting it would error the instance of a node being shut down.
		a.goodbye(sess)
		return err
	}
	var gaveUp *bootFailure
	if errors.As(err, &gaveUp) {
		a.status.SetBootFailed(err)
	} else {
		a.status.SetError(err)
	}
	sess.WaitSent(ctx, 3*time.Second)
	sess.Close(3 * time.Second)
	return err
}

// enroll trades the discovered token for a certificate, or, on a
// tokenless boot, proves the machine by its TPM; it retries while the
// control plane is unreachable.
func (a *agent) enroll(ctx context.Context, mgr *enroll.Manager, disc identity.Discovery) (*enroll.Identity, error) {
	if err := disc.Require(true); err != nil {
		return nil, err
	}
	if disc.Token == "" {
		return a.enrollAttested(ctx, mgr, disc)
	}
	if mgr.TokenSpent(disc.Token) {
		return nil, errors.New("the bootstrap token this node holds was already spent by an earlier enrollment of this node, whose identity is gone; " +
			"mint a new one with `tetherctl token create --instance ID` and hand it to the node, or reboot the instance so it gets a fresh one")
	}
	a.setPhase(tetherv1.AgentPhase_AGENT_PHASE_ENROLLING)
	a.con.Printf("enrolling with %s", disc.URL)
	conn, err := mgr.Dial(false)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	client := tetherv1.NewEnrollmentServiceClient(conn)
	var id *enroll.Identity
	err = a.retry(ctx, "enrollment", func() error {
		var err error
		id, err = mgr.Enroll(ctx, client, disc.Token)
		return err
	})
	var pm *enroll.PinMismatchError
	switch {
	case err == nil:
		a.con.Printf("enrolled as instance %s (certificate valid until %s)", id.InstanceID, stamp(id.Cert.NotAfter))
		return id, nil
	case errors.As(err, &pm):
		return nil, pm
	case status.Code(err) == codes.Unauthenticated:
		return nil, fmt.Errorf("the control plane refused the bootstrap token (%v): a token works once and expires 24 h after it was minted; "+
			"mint a new one with `tetherctl token create --instance ID` and hand it to the node, or reboot the instance so it gets a fresh one", err)
	default:
		return nil, err
	}
}

// retry runs fn until it succeeds or fails with an error that waiting
// will not fix, printing each transient failure with the wait.
func (a *agent) retry(ctx context.Context, what string, fn func() error) error {
	for attempt := 0; ; attempt++ {
		err := fn()
		if err == nil || !transient(err) {
			return err
		}
		d := a.backoff.Delay(attempt)
		a.con.Printf("%s failed: %v; retrying in %s (check that the control plane is up and reachable from this node)", what, err, d.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-a.cfg.Clock.After(d):
		}
	}
}

func transient(err error) bool {
	var pm *enroll.PinMismatchError
	if errors.As(err, &pm) {
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted:
		return true
	}
	return false
}

// bringUp pulls and verifies the assigned modules and, in switch mode,
// composes the root and switches into it.
func (a *agent) bringUp(ctx context.Context, conns *connHolder, sess *session.Session, reopen func() *session.Session, st *savedState) error {
	asg, err := a.assignment(ctx, conns)
	if err != nil {
		return err
	}
	layers, digests, err := a.pull(ctx, conns, asg)
	if err != nil {
		return err
	}
	a.status.SetModules(digests)
	if a.cfg.RootMode != RootModeSwitch {
		return nil
	}
	root := a.cfg.Root
	if root == nil {
		return fmt.Errorf("%w; run with --root-mode=none to verify modules without switching", errNoRootSwitcher)
	}
	if len(layers) == 0 {
		return errors.New("the template assigns no root layers, so there is no root to switch into; add root modules to the template (tetherctl template create NAME --root MOD:VER) or run with --root-mode=none")
	}
	a.setPhase(tetherv1.AgentPhase_AGENT_PHASE_MOUNTING)
	if err := root.Compose(ctx, layers, a.cfg.RootWorkDir, a.cfg.RootTarget); err != nil {
		return fmt.Errorf("compose the root from %d layers at %s: %w (the kernel needs the loop, erofs and overlay modules)", len(layers), a.cfg.RootTarget, err)
	}
	st.Switched, st.Modules = true, digests[:len(layers)]
	if err := saveState(a.cfg.StateDir, *st); err != nil {
		return fmt.Errorf("save agent state for the new root: %w", err)
	}
	a.setPhase(tetherv1.AgentPhase_AGENT_PHASE_SWITCHING)
	// The exec ends this process's stream: get the phase out first, and
	// close the stream so nothing is left in a buffer. The control plane's
	// confirmation is a round trip, in which the guest's CPU would idle:
	// the switch moves the mounts and frees the initramfs meanwhile, and
	// waits for it just before the exec (or on its way out, if it fails).
	drained := make(chan bool, 1)
	go func() {
		sess.WaitSent(ctx, 3*time.Second)
		drained <- sess.Close(3 * time.Second)
	}()
	var waited sync.Once
	waitDrained := func() {
		waited.Do(func() {
			if !<-drained {
				a.con.Printf("the control plane did not confirm the switching heartbeat; switching anyway")
			}
		})
	}
	a.prepareHandover()
	a.con.Printf("switching root to %s", a.cfg.RootTarget)
	err = root.Switch(a.cfg.RootTarget, waitDrained)
	// A Switch that returned did not exec; the stream must be closed
	// before it is opened again.
	waitDrained()
	if errors.Is(err, ErrNoInit) {
		a.con.Printf("%v: this agent stays on as the root's supervisor", err)
		reopen()
		return nil
	}
	if err == nil {
		err = errors.New("switch returned without error but did not exec the new init")
	}
	err = fmt.Errorf("switch root to %s: %w (the node may be half switched: reboot it once the cause is fixed)", a.cfg.RootTarget, err)
	st.Switched = false
	if serr := saveState(a.cfg.StateDir, *st); serr != nil {
		// The saved state still says switched: an agent started on this
		// root would take it for the composed one.
		err = errors.Join(err, fmt.Errorf("record the failed switch in %s: %w", a.cfg.StateDir, serr))
	}
	// The stream was closed for the exec; open it again so the failure
	// reaches the control plane.
	reopen()
	return err
}

func (a *agent) assignment(ctx context.Context, conns *connHolder) (*tetherv1.Assignment, error) {
	var asg *tetherv1.Assignment
	err := a.retry(ctx, "fetching the module assignment", func() error {
		var err error
		asg, err = conns.Client().GetAssignment(ctx, &tetherv1.GetAssignmentRequest{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("get assignment: %w", err)
	}
	return asg, nil
}

// pull fetches and verifies every assigned module, root layers first. It
// returns the root layers and the digests of every verified module.
func (a *agent) pull(ctx context.Context, conns *connHolder, asg *tetherv1.Assignment) ([]Layer, []string, error) {
	if err := a.checkSignatures(asg); err != nil {
		return nil, nil, err
	}
	if err := a.checkMemory(asg); err != nil {
		return nil, nil, err
	}
	a.setPhase(tetherv1.AgentPhase_AGENT_PHASE_PULLING)
	f, err := a.fetcher(conns)
	if err != nil {
		return nil, nil, err
	}
	var layers []Layer
	var digests []string
	for i, m := range append(append([]*tetherv1.Module(nil), asg.GetRootModules()...), asg.GetExtensionModules()...) {
		path, err := f.Fetch(ctx, m)
		if err != nil {
			return nil, nil, err
		}
		if i < len(asg.GetRootModules()) {
			layers = append(layers, Layer{Name: modules.Name(m), Path: path})
		}
		digests = append(digests, m.GetDigest())
	}
	return layers, digests, nil
}

// checkSignatures applies the signing policy (the node's anchor, then what
// the assignment adds) before anything is fetched, and says so on the
// console: a refusal names the module and the reason.
func (a *agent) checkSignatures(asg *tetherv1.Assignment) error {
	start := a.cfg.Clock.Now()
	err := modules.CheckSignatures(asg, a.policy)
	n := len(asg.GetRootModules()) + len(asg.GetExtensionModules())
	if err != nil {
		a.con.Printf("REFUSED: %v; this root will not be mounted", err)
		return err
	}
	if len(a.policy.Anchors) > 0 || len(asg.GetRequiredSigners()) > 0 || asg.GetRequireSignedModules() {
		a.con.Printf("signatures: %d modules verified in %s", n, a.cfg.Clock.Now().Sub(start).Round(time.Microsecond))
	}
	return nil
}

func (a *agent) fetcher(conns *connHolder) (*modules.Fetcher, error) {
	return modules.New(modules.Config{
		Dir:      filepath.Join(a.cfg.StateDir, "modules"),
		Client:   conns.Client,
		Progress: newProgressPrinter(a.con).report,
		Logf:     a.con.Printf,
		Delay:    a.backoff.Delay,
		After:    a.cfg.Clock.After,
	})
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }
