package carotation

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/pki"
	"github.com/tetherfleet/tether/pki/ca"
)

// CA is one CA of the set as `tetherctl ca list` shows it.
type CA struct {
	store.Authority
	Subject string
	// Live counts the certificates it signed that are neither revoked
	// nor expired.
	Live int
}

// List is the set, oldest first, each with its live certificates.
func (s *Service) List(ctx context.Context) ([]CA, error) {
	all, err := s.Store.ListAuthorities(ctx)
	if err != nil {
		return nil, err
	}
	live, err := s.Store.CountLiveCertificates(ctx, s.Clock.Now())
	if err != nil {
		return nil, err
	}
	return describe(all, live), nil
}

func describe(all []*store.Authority, live map[string]int) []CA {
	out := make([]CA, 0, len(all))
	for _, a := range all {
		c := CA{Authority: *a, Live: live[a.Fingerprint]}
		c.KeySealed = nil
		if cert, err := ca.ParseCertificatePEM([]byte(a.CertPEM)); err == nil {
			c.Subject = cert.Subject.CommonName
		}
		out = append(out, c)
	}
	return out
}

// find is the CA with fingerprint fp, and the one in state.
func find(all []*store.Authority, fp, state string) (byFP, inState *store.Authority) {
	for _, a := range all {
		if a.Fingerprint == fp {
			byFP = a
		}
		if a.State == state {
			inState = a
		}
	}
	return byFP, inState
}

// Prepare makes a new CA, cross-signed by the active one, and records it
// prepared: every replica trusts it from now on, none signs with it yet.
// A CA already prepared is refused and kept.
func (s *Service) Prepare(ctx context.Context, keyType, by string) (*CA, error) {
	kt, err := ca.ParseKeyType(keyType)
	if err != nil {
		return nil, fail.Invalid("key_type", "%v", err)
	}
	now := s.Clock.Now()
	all, err := s.Store.ListAuthorities(ctx)
	if err != nil {
		return nil, err
	}
	if err := refusePrepare(all); err != nil {
		return nil, err
	}
	_, active := find(all, "", store.AuthorityActive)
	if active == nil {
		return nil, fail.Precondition("no CA is active (%s)", fingerprints(all))
	}
	activeCert, err := ca.ParseCertificatePEM([]byte(active.CertPEM))
	if err != nil {
		return nil, fail.Internal("CA %s: %v", active.Fingerprint, err)
	}
	activeKey, err := s.key(active)
	if err != nil {
		return nil, fail.Internal("%v", err)
	}
	root, key, err := ca.GenerateRoot("Tether CA "+now.UTC().Format("20060102T150405Z"), kt, now)
	if err != nil {
		return nil, fail.Internal("%v", err)
	}
	cross, err := ca.CrossSign(activeCert, activeKey, root, now)
	if err != nil {
		return nil, fail.Internal("%v", err)
	}
	keyPEM, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fail.Internal("encode the new CA key: %v", err)
	}
	fp := pki.Fingerprint(root.Raw)
	sealed, err := s.Sealer.Seal(sealName(fp), keyPEM)
	if err != nil {
		return nil, fail.Internal("seal the new CA key: %v", err)
	}
	a := &store.Authority{Fingerprint: fp, CertPEM: string(ca.CertPEM(root)), KeySealed: sealed,
		CrossPEM: string(ca.CertPEM(cross)),
		State:    store.AuthorityPrepared, NotAfter: root.NotAfter, CreatedAt: now, UpdatedAt: now}
	err = s.Store.Tx(ctx, func(q store.Queries) error {
		// Again inside: another replica may have prepared one meanwhile.
		all, err := q.ListAuthorities(ctx)
		if err != nil {
			return err
		}
		if err := refusePrepare(all); err != nil {
			return err
		}
		if _, now := find(all, "", store.AuthorityActive); now == nil || now.Fingerprint != active.Fingerprint {
			return fail.Precondition("the active CA changed while CA %s was being prepared: prepare again", fp)
		}
		if err := q.CreateAuthority(ctx, a); err != nil {
			if errors.Is(err, store.ErrAlreadyExists) {
				return fail.Precondition("another CA was prepared meanwhile: one rotation at a time")
			}
			return err
		}
		return s.record(ctx, q, now, events.E{Kind: events.CAPrepared, Severity: events.High,
			Message: fmt.Sprintf("CA %s prepared (cross-signed by the active CA %s); every replica trusts it, none signs with it until `tetherctl ca activate`", fp, active.Fingerprint),
			Payload: events.CAPreparedPayload{Active: active.Fingerprint, By: by, Fingerprint: fp}}, fp)
	})
	if err != nil {
		return nil, err
	}
	if err := s.Load(ctx); err != nil {
		return nil, fail.Internal("%v", err)
	}
	out := describe([]*store.Authority{a}, nil)[0]
	return &out, nil
}

func refusePrepare(all []*store.Authority) error {
	if _, p := find(all, "", store.AuthorityPrepared); p != nil {
		return fail.Precondition("CA %s is already prepared (since %s): activate it (`tetherctl ca activate`) or retire it before preparing another",
			p.Fingerprint, p.CreatedAt.UTC().Format(time.RFC3339))
	}
	return nil
}

// Activate makes the prepared CA the one that signs, and the active one
// old: still trusted, signing nothing new. fp, when given, must name the
// prepared CA.
func (s *Service) Activate(ctx context.Context, fp, by string) (*CA, error) {
	if fp != "" {
		var err error
		if fp, err = pki.ParseFingerprint(fp); err != nil {
			return nil, fail.Invalid("fingerprint", "%v", err)
		}
	}
	now := s.Clock.Now()
	var out *store.Authority
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		all, err := q.ListAuthorities(ctx)
		if err != nil {
			return err
		}
		named, prepared := find(all, fp, store.AuthorityPrepared)
		switch {
		case fp != "" && named == nil:
			return fail.NotFound("no CA has fingerprint %s (the set: %s)", fp, fingerprints(all))
		case fp != "" && named.State != store.AuthorityPrepared:
			return fail.Precondition("CA %s is %s, not prepared: only a prepared CA can be activated", fp, named.State)
		case prepared == nil:
			return fail.Precondition("no CA is prepared (the set: %s): run `tetherctl ca prepare` first", fingerprints(all))
		}
		_, active := find(all, "", store.AuthorityActive)
		if active != nil {
			if err := q.SetAuthorityState(ctx, active.Fingerprint, store.AuthorityActive, store.AuthorityOld, now); err != nil {
				return err
			}
		}
		if err := q.SetAuthorityState(ctx, prepared.Fingerprint, store.AuthorityPrepared, store.AuthorityActive, now); err != nil {
			return err
		}
		prepared.State, prepared.UpdatedAt, out = store.AuthorityActive, now, prepared
		old := ""
		if active != nil {
			old = active.Fingerprint
		}
		return s.record(ctx, q, now, events.E{Kind: events.CAActivated, Severity: events.High,
			Message: fmt.Sprintf("CA %s activated: it signs every certificate from now on, and boots are handed its fingerprint; %s is old, trusted until `tetherctl ca retire`", prepared.Fingerprint, old),
			Payload: events.CAActivatedPayload{By: by, Fingerprint: prepared.Fingerprint, Old: old}}, prepared.Fingerprint)
	})
	if err != nil {
		return nil, err
	}
	if err := s.Load(ctx); err != nil {
		return nil, fail.Internal("%v", err)
	}
	return s.one(ctx, out)
}

// Retire stops trusting a CA: an old one once every certificate it
// signed has expired or been revoked, or a prepared one (a rotation
// abandoned). The active CA, and so the only one, is refused.
func (s *Service) Retire(ctx context.Context, fp, by string) (*CA, error) {
	fp, err := pki.ParseFingerprint(fp)
	if err != nil {
		return nil, fail.Invalid("fingerprint", "%v", err)
	}
	now := s.Clock.Now()
	var out *store.Authority
	err = s.Store.Tx(ctx, func(q store.Queries) error {
		all, err := q.ListAuthorities(ctx)
		if err != nil {
			return err
		}
		a, _ := find(all, fp, "")
		if a == nil {
			return fail.NotFound("no CA has fingerprint %s (the set: %s)", fp, fingerprints(all))
		}
		switch a.State {
		case store.AuthorityActive:
			standing := 0
			for _, o := range all {
				if o.State != store.AuthorityRetired {
					standing++
				}
			}
			if standing == 1 {
				return fail.Precondition("CA %s is active and the only CA: a control plane needs one; rotate (`tetherctl ca prepare`, `ca activate`) first", fp)
			}
			return fail.Precondition("CA %s is active: activate another CA before retiring it", fp)
		case store.AuthorityRetired:
			return fail.Precondition("CA %s is retired already (since %s)", fp, a.UpdatedAt.UTC().Format(time.RFC3339))
		case store.AuthorityOld:
			live, err := q.CountLiveCertificates(ctx, now)
			if err != nil {
				return err
			}
			if n := live[fp]; n > 0 {
				return fail.Precondition("CA %s is old and still has %d live certificates (neither expired nor revoked): retire it when they have expired (node certificates renew under the active CA; `tetherctl ca list` counts them) or revoke them", fp, n)
			}
		}
		from := a.State
		if err := q.SetAuthorityState(ctx, fp, from, store.AuthorityRetired, now); err != nil {
			return err
		}
		a.State, a.UpdatedAt, out = store.AuthorityRetired, now, a
		return s.record(ctx, q, now, events.E{Kind: events.CARetired, Severity: events.High,
			Message: fmt.Sprintf("CA %s retired (it was %s): no replica trusts a certificate it signed any more", fp, from),
			Payload: events.CARetiredPayload{By: by, Fingerprint: fp, Was: from}}, fp)
	})
	if err != nil {
		return nil, err
	}
	if err := s.Load(ctx); err != nil {
		return nil, fail.Internal("%v", err)
	}
	return s.one(ctx, out)
}

// record writes a step's event and tells every replica to reload.
func (s *Service) record(ctx context.Context, q store.Queries, now time.Time, e events.E, fp string) error {
	if _, err := e.Write(ctx, q, now); err != nil {
		return err
	}
	return q.Notify(ctx, store.ChannelAuthorities, fp)
}

func (s *Service) one(ctx context.Context, a *store.Authority) (*CA, error) {
	live, err := s.Store.CountLiveCertificates(ctx, s.Clock.Now())
	if err != nil {
		return nil, err
	}
	out := describe([]*store.Authority{a}, live)[0]
	return &out, nil
}
