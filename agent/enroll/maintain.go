package enroll

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// TokenSource looks for a bootstrap token again (the orchestrator reruns
// discovery: an operator may have handed the node a fresh one).
type TokenSource func(ctx context.Context) (string, error)

// AttesterCloser is the machine's TPM, opened for one enrollment.
type AttesterCloser interface {
	Attester
	io.Closer
}

// Recovery is what can replace a certificate that expired while the node
// was cut off: an unused bootstrap token that discovery turns up, or the
// machine's TPM, which proves it again with no token at all (an attested
// enrollment for the same instance, docs/adr/0030).
type Recovery struct {
	// Tokens looks for a token (nil: none is looked for).
	Tokens TokenSource
	// OpenTPM opens the TPM for an attested re-enrollment (nil: not
	// tried). A machine without one answers an error, which is reported
	// with the rest of the reason.
	OpenTPM func() (AttesterCloser, error)
}

// ExpiredError says the certificate lapsed and why the agent could not get
// a new one yet.
type ExpiredError struct {
	InstanceID string
	NotAfter   time.Time
	Reason     string
}

func (e *ExpiredError) Error() string {
	return fmt.Sprintf("certificate for instance %s expired at %s: this node was cut off from the control plane for longer than the certificate's lifetime, "+
		"and %s. Mint a token with `tetherctl token create --instance %s` and hand it to the node (fw_cfg, seed ISO, or --token), "+
		"bind this machine's TPM to its node (`tetherctl node update NODE --ek HASH`; it re-attests on its own), or reboot the instance so it boots with a fresh one",
		e.InstanceID, e.NotAfter.UTC().Format(time.RFC3339), e.Reason, e.InstanceID)
}

// subscribers extends Changed to more than one listener.
type subscribers struct {
	mu   sync.Mutex
	subs []chan struct{}
}

// Subscribe returns a channel signalled (coalesced) on every identity change.
func (m *Manager) Subscribe() <-chan struct{} {
	m.subs.mu.Lock()
	defer m.subs.mu.Unlock()
	ch := make(chan struct{}, 1)
	m.subs.subs = append(m.subs.subs, ch)
	return ch
}

func (m *Manager) notify() {
	m.subs.mu.Lock()
	defer m.subs.mu.Unlock()
	for _, ch := range m.subs.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Maintain keeps the certificate valid until ctx ends: it renews at two
// thirds of the lifetime, retries failed renewals with backoff (saying why
// each time), and recovers from an expired certificate (see Recover).
// agent returns a client on the current mTLS connection.
func (m *Manager) Maintain(ctx context.Context, agent func() tetherv1.AgentServiceClient, rec Recovery) error {
	changed := m.Subscribe()
	attempt := 0
	for {
		id := m.Current()
		if id == nil {
			return errors.New("maintain: not enrolled")
		}
		now := m.cfg.Clock.Now()
		if id.Expired(now) {
			if err := m.Recover(ctx, agent, rec); err != nil {
				return err
			}
			attempt = 0
			continue
		}
		if wait := id.RenewAt().Sub(now); wait > 0 {
			// Re-evaluate on wake-up: a forced renewal may have moved the
			// deadline meanwhile.
			// A timer, stopped on the way out: a wake-up by a change
			// must not leave the old wait armed.
			t := m.cfg.Clock.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C():
			case <-changed:
				t.Stop()
			}
			continue
		}
		renewed, err := m.Renew(ctx, agent())
		if err == nil {
			m.cfg.Logf("certificate renewed with a fresh key (valid until %s)", stamp(renewed.Cert.NotAfter))
			attempt = 0
			continue
		}
		d := m.cfg.Delay(attempt)
		attempt++
		m.cfg.Logf("certificate renewal failed: %v; retrying in %s (the current certificate is valid until %s; check that the control plane is reachable)",
			err, d.Round(time.Millisecond), stamp(id.Cert.NotAfter))
		if err := m.sleep(ctx, d); err != nil {
			return err
		}
	}
}

// Recover gets a valid certificate back after the current one expired. If
// discovery turns up a token this node has not spent, it enrolls again;
// otherwise, on a machine with a TPM, it enrolls again by attestation for
// the same instance; otherwise it keeps trying (a renewal, discovery and
// the TPM again, in case a token is handed over or the TPM is bound) with
// backoff, printing the reason every time.
func (m *Manager) Recover(ctx context.Context, agent func() tetherv1.AgentServiceClient, rec Recovery) error {
	id := m.Current()
	if id == nil {
		return errors.New("recover: not enrolled")
	}
	m.cfg.Logf("certificate for instance %s expired at %s while this node could not reach the control plane; trying to get a new one",
		id.InstanceID, stamp(id.Cert.NotAfter))
	for attempt := 0; ; attempt++ {
		err := m.recoverOnce(ctx, id, agent, rec)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		d := m.cfg.Delay(attempt)
		m.cfg.Logf("%v; retrying in %s", err, d.Round(time.Millisecond))
		if err := m.sleep(ctx, d); err != nil {
			return err
		}
	}
}

func (m *Manager) recoverOnce(ctx context.Context, old *Identity, agent func() tetherv1.AgentServiceClient, rec Recovery) error {
	reason := "no bootstrap token was found"
	if rec.Tokens != nil {
		tok, err := rec.Tokens(ctx)
		switch {
		case err != nil:
			reason = fmt.Sprintf("looking for a bootstrap token failed (%v)", err)
		case tok == "":
		case m.TokenSpent(tok):
			reason = "the only bootstrap token it holds was spent when it enrolled"
		default:
			id, err := m.enrollFresh(ctx, tok)
			if err != nil {
				return fmt.Errorf("re-enrolling with the unused bootstrap token failed: %w", err)
			}
			m.cfg.Logf("re-enrolled as instance %s with an unused bootstrap token (certificate valid until %s)", id.InstanceID, stamp(id.Cert.NotAfter))
			return nil
		}
	}
	// The TPM needs no token: a node whose EK is bound proves itself
	// again, as it did at boot.
	if rec.OpenTPM != nil {
		id, err := m.reattest(ctx, old.InstanceID, rec.OpenTPM)
		if err == nil {
			m.cfg.Logf("re-enrolled as instance %s by TPM attestation, with no token (certificate valid until %s)", id.InstanceID, stamp(id.Cert.NotAfter))
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		reason += fmt.Sprintf(", and re-enrolling by TPM attestation failed (%v)", err)
	}
	// A control plane may still renew a certificate that lapsed a moment
	// ago; try before giving the operator work.
	if agent != nil {
		if id, err := m.Renew(ctx, agent()); err == nil {
			m.cfg.Logf("certificate renewed after expiry (valid until %s)", stamp(id.Cert.NotAfter))
			return nil
		}
	}
	return &ExpiredError{InstanceID: old.InstanceID, NotAfter: old.Cert.NotAfter, Reason: reason}
}

// reattest enrolls instanceID again by the TPM on a fresh connection
// that presents no certificate (the expired one would be refused).
func (m *Manager) reattest(ctx context.Context, instanceID string, open func() (AttesterCloser, error)) (*Identity, error) {
	t, err := open()
	if err != nil {
		return nil, fmt.Errorf("open the TPM: %w", err)
	}
	defer t.Close()
	conn, err := m.Dial(false)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return m.EnrollAttested(ctx, tetherv1.NewEnrollmentServiceClient(conn), instanceID, t)
}

func (m *Manager) enrollFresh(ctx context.Context, token string) (*Identity, error) {
	conn, err := m.Dial(false)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return m.Enroll(ctx, tetherv1.NewEnrollmentServiceClient(conn), token)
}

func (m *Manager) sleep(ctx context.Context, d time.Duration) error {
	t := m.cfg.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C():
		return nil
	}
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }
