package agent

import (
	"context"

	"github.com/tetherfleet/tether/agent/enroll"
	"github.com/tetherfleet/tether/agent/identity"
	"github.com/tetherfleet/tether/agent/session"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// phaseConnect dials the control plane (recovering an expired
// certificate first), opens the session and starts the loops that keep
// the identity and the connection fresh.
func (a *agent) phaseConnect(ctx context.Context, s *bootState) error {
	cfg := a.cfg
	conns, err := newConnHolder(s.mgr, cfg.ConnGrace)
	if err != nil {
		return err
	}
	s.conns = conns
	// Every loop that uses the connection has stopped by then, so a
	// shutdown does not print a lost stream.
	s.loops.OnStop(conns.Close)
	// An expired certificate (a partition longer than its lifetime) is
	// replaced by an unspent token if one turns up, else by the TPM.
	s.recovery = enroll.Recovery{
		Tokens: func(ctx context.Context) (string, error) {
			// A later look: the boot's hand-off was spent at start.
			d, err := identity.Discover(ctx, s.explicit, withoutHandoff(cfg.Sources)...)
			return d.Token, err
		},
		OpenTPM: a.openTPM,
	}
	if s.id.Expired(cfg.Clock.Now()) {
		a.setPhase(tetherv1.AgentPhase_AGENT_PHASE_ENROLLING)
		if err := s.mgr.Recover(ctx, conns.Client, s.recovery); err != nil {
			return err
		}
		// The connection may have failed its handshake with the expired
		// certificate and be backing off; start afresh with the new one.
		if err := conns.redial(); err != nil {
			return err
		}
		s.id = s.mgr.Current()
	}

	a.startSession(s)
	changed := s.mgr.Subscribe()
	s.loops.Go("certificate maintenance (renewal and recovery)", func(ctx context.Context) error {
		return s.mgr.Maintain(ctx, conns.Client, s.recovery)
	})
	s.loops.Go("the watchdog", func(ctx context.Context) error { pingWatchdog(ctx, cfg.Notifier); return nil })
	s.loops.Go("reconnecting after a renewal", func(ctx context.Context) error {
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-changed:
				if err := conns.redial(); err != nil {
					a.con.Printf("reconnecting with the renewed certificate failed: %v; the old connection stays in use", err)
					continue
				}
				s.sess.get().Reconnect()
			}
		}
	})
	if cfg.PowerButtons != "" {
		power := a.power(s.successor)
		s.loops.Go("the power button", func(ctx context.Context) error { a.watchPowerButton(ctx, power); return nil })
	}
	return nil
}

// startSession opens the Connect stream. It runs again if the stream was
// closed for a switch of root that then found no init to hand over to.
//
// The session outlives the boot's context by its goodbye (phaseServe): a
// stop (systemd's SIGTERM at poweroff) must not cut the stream before the
// last heartbeat and every queued task update are read. Its tasks are
// cancelled when the runner stops.
func (a *agent) startSession(s *bootState) {
	cfg := a.cfg
	sess := session.New(session.Config{
		Client:    s.conns.Client,
		Status:    a.status,
		Runner:    a.executor(s.mgr, s.conns, s.successor),
		Clock:     cfg.Clock,
		Backoff:   a.backoff,
		Version:   cfg.Version,
		BootID:    cfg.BootID,
		Uptime:    cfg.Uptime,
		Addresses: cfg.Addresses,
		Logf:      a.con.Printf,
		// A CA rotation's bundle: trusted once it chains to the pin.
		OnTrustBundle: s.mgr.ApplyBundle,
	})
	s.sess.set(sess)
	s.loops.GoUntilStop("the control plane session", sess.Run)
}
