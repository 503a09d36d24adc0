package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/agent/enroll"
	"github.com/tetherfleet/tether/agent/identity"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// phaseEnroll reuses the identity saved by this boot or gets one (a token,
// else the TPM), and saves the state the successor of a switch reads.
func (a *agent) phaseEnroll(ctx context.Context, s *bootState) error {
	cfg := a.cfg
	mgr, err := enroll.New(enroll.Config{
		StateDir: cfg.StateDir, URL: s.disc.URL, CAFingerprint: s.disc.CA, Clock: cfg.Clock,
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
		if id, err = a.enroll(ctx, mgr, s.disc); err != nil {
			return err
		}
	}
	s.mgr, s.id = mgr, id
	st := &a.st
	st.BootID, st.URL, st.CA = cfg.BootID, s.disc.URL, s.disc.CA
	if !s.successor {
		st.Switched, st.Modules, st.Extensions = false, nil, nil
	}
	if err := saveState(cfg.StateDir, *st); err != nil {
		return fmt.Errorf("save agent state in %s: %w", cfg.StateDir, err)
	}
	return nil
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
	id, err := a.enrollOnce(ctx, mgr, "enrollment", func(c tetherv1.EnrollmentServiceClient) (*enroll.Identity, error) {
		return mgr.Enroll(ctx, c, disc.Token)
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

// enrollOnce dials the enrollment service and runs do until it succeeds
// or fails with an error waiting will not fix: what the token and the
// attested enrollment share.
func (a *agent) enrollOnce(ctx context.Context, mgr *enroll.Manager, what string, do func(tetherv1.EnrollmentServiceClient) (*enroll.Identity, error)) (*enroll.Identity, error) {
	conn, err := mgr.Dial(false)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	client := tetherv1.NewEnrollmentServiceClient(conn)
	var id *enroll.Identity
	err = a.retry(ctx, what, func() error {
		var err error
		id, err = do(client)
		return err
	})
	return id, err
}

// retry runs fn until it succeeds or fails with an error that waiting
// will not fix, printing each transient failure with the wait.
func (a *agent) retry(ctx context.Context, what string, fn func() error) error {
	for attempt := 0; ; attempt++ {
		err := fn()
		if err == nil || !enroll.Transient(err) {
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
