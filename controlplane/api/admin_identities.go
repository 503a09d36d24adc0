package api

import (
	"context"
	"crypto/x509"
	"errors"
	"strings"
	"time"

	"github.com/tetherfleet/tether/controlplane/certificates"
	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/pki"
	"github.com/tetherfleet/tether/pki/ca"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// maxIdentityTTL bounds what an admin may ask for: renewal exists so that
// no identity lives long unattended.
const maxIdentityTTL = 366 * 24 * time.Hour

func identityTTL(field string, seconds int64) (time.Duration, error) {
	if seconds < 0 || time.Duration(seconds)*time.Second > maxIdentityTTL {
		return 0, fail.Invalid(field, "%ds is out of range (0 for the default of %s, at most %s)", seconds, ca.DefaultAdminLifetime, maxIdentityTTL)
	}
	return time.Duration(seconds) * time.Second, nil
}

// identityCSR parses a CSR and checks its self-signature. The CSR is
// never stored or logged: only the certificate made from it is recorded.
func identityCSR(field, pemText string) (*x509.CertificateRequest, error) {
	csr, err := ca.ParseCSR([]byte(pemText))
	if err != nil {
		return nil, fail.Invalid(field, "%v", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fail.Invalid(field, "bad self-signature: %v", err)
	}
	return csr, nil
}

// issueIdentity signs an admin certificate and records it and the identity
// in one transaction.
func (a *adminServer) issueIdentity(ctx context.Context, name string, role store.Role, csr *x509.CertificateRequest, ttl time.Duration, create bool) (*v1.IdentityCertificate, error) {
	cert, err := a.CA.SignAdmin(name, role.String(), csr.PublicKey, ttl)
	if err != nil {
		return nil, fail.Internal("sign identity %s: %v", name, err)
	}
	now := a.Clock.Now()
	serial := ca.SerialString(cert)
	id := &store.AdminIdentity{Name: name, Role: role, Serial: serial, NotAfter: cert.NotAfter, CreatedAt: now}
	err = a.Store.Tx(ctx, func(q store.Queries) error {
		prev, err := q.GetAdminIdentity(ctx, name)
		switch {
		case err == nil && create:
			return fail.Exists("identity %q already exists (role %s); revoke it first, or renew it as that identity", name, prev.Role)
		case err == nil:
			if !prev.RevokedAt.IsZero() {
				return fail.Precondition("identity %q is revoked", name)
			}
			id.CreatedAt = prev.CreatedAt
		case !errors.Is(err, store.ErrNotFound):
			return err
		}
		subject := pki.Identity{Kind: pki.KindAdmin, Name: name, Role: role.String()}.String()
		if err := q.CreateCertificate(ctx, &store.Certificate{Serial: serial, Kind: pki.KindAdmin, Subject: subject,
			Issuer: pki.Fingerprint(a.CA.IssuerOf(cert).Raw), NotBefore: cert.NotBefore, NotAfter: cert.NotAfter, CreatedAt: now}); err != nil {
			return err
		}
		if err := q.PutAdminIdentity(ctx, id); err != nil {
			return err
		}
		caller, _ := CallerFrom(ctx)
		_, err = events.E{Kind: events.CertIssued, Message: "admin identity " + name + " (" + role.String() + ") certificate " + serial + " issued",
			Payload: map[string]any{"identity": name, "role": role, "serial": serial, "by": caller.Identity.Name}}.Write(ctx, q, now)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &v1.IdentityCertificate{Identity: identityProto(id), CertificatePem: string(ca.CertPEM(cert)), CaPem: string(ca.CertPEM(a.CA.IssuerOf(cert)))}, nil
}

func (a *adminServer) CreateIdentity(ctx context.Context, req *v1.CreateIdentityRequest) (*v1.IdentityCertificate, error) {
	if err := modules.ValidateName("name", req.Name); err != nil {
		return nil, err
	}
	role, err := store.ParseRole(req.Role)
	if err != nil {
		return nil, fail.Invalid("role", "%q: want viewer, operator or admin", req.Role)
	}
	ttl, err := identityTTL("ttl_seconds", req.TtlSeconds)
	if err != nil {
		return nil, err
	}
	csr, err := identityCSR("csr_pem", req.CsrPem)
	if err != nil {
		return nil, err
	}
	return a.issueIdentity(ctx, req.Name, role, csr, ttl, true)
}

// RenewIdentity issues the caller a fresh certificate with the same name
// and role: an identity can renew only itself, and never raise its role.
// Nor can it outlive what the admin granted: the new certificate ends no
// later than the one renewing (ADR 0018), so renewal rotates the key and
// the lifetime stays the admin's choice.
func (a *adminServer) RenewIdentity(ctx context.Context, req *v1.RenewIdentityRequest) (*v1.IdentityCertificate, error) {
	c, ok := CallerFrom(ctx)
	if !ok || c.Identity.Kind != pki.KindAdmin {
		return nil, fail.Unauthenticated("renewal needs an admin identity certificate")
	}
	ttl, err := identityTTL("ttl_seconds", req.TtlSeconds)
	if err != nil {
		return nil, err
	}
	csr, err := identityCSR("csr_pem", req.CsrPem)
	if err != nil {
		return nil, err
	}
	if ttl <= 0 {
		ttl = ca.DefaultAdminLifetime
	}
	// The certificate renewing carries the grant: every renewal ends no
	// later than the one before, back to the one an admin minted.
	granted := c.NotAfter.Sub(a.Clock.Now())
	if granted < time.Second {
		return nil, fail.Precondition("identity %q was granted until %s; only an admin can mint it a new identity", c.Identity.Name, c.NotAfter.UTC().Format(time.RFC3339))
	}
	ttl = min(ttl, granted)
	return a.issueIdentity(ctx, c.Identity.Name, store.Role(c.Identity.Role), csr, ttl, false)
}

func (a *adminServer) ListIdentities(ctx context.Context, _ *v1.ListIdentitiesRequest) (*v1.ListIdentitiesResponse, error) {
	ids, err := a.Store.ListAdminIdentities(ctx)
	if err != nil {
		return nil, err
	}
	out := &v1.ListIdentitiesResponse{}
	for _, id := range ids {
		out.Identities = append(out.Identities, identityProto(id))
	}
	return out, nil
}

// RevokeIdentity revokes every certificate the identity was ever issued
// (renewal leaves the earlier ones valid until they expire); the next call
// of any of them is refused on every replica. Revoking a revoked identity
// again revokes any of its certificates still left.
func (a *adminServer) RevokeIdentity(ctx context.Context, req *v1.RevokeIdentityRequest) (*v1.AdminIdentity, error) {
	if req.Name == "" {
		return nil, fail.Invalid("name", "required")
	}
	caller, _ := CallerFrom(ctx)
	now := a.Clock.Now()
	var id *store.AdminIdentity
	var serials []string
	err := a.Store.Tx(ctx, func(q store.Queries) error {
		var err error
		if id, err = q.GetAdminIdentity(ctx, req.Name); err != nil {
			return err
		}
		if id.RevokedAt.IsZero() {
			id.RevokedAt = now
			if err := q.PutAdminIdentity(ctx, id); err != nil {
				return err
			}
		}
		reason := "identity " + id.Name + " revoked by " + caller.Identity.Name
		if serials, err = certificates.RevokeIdentity(ctx, q, id, reason, now); err != nil {
			return err
		}
		if len(serials) == 0 {
			return nil
		}
		if _, err := (events.E{Kind: events.CertRevoked, Severity: events.Medium,
			Message: "admin identity " + id.Name + " revoked (certificates " + strings.Join(serials, ", ") + ")",
			Payload: map[string]any{"identity": id.Name, "serial": id.Serial, "serials": serials, "by": caller.Identity.Name}}).Write(ctx, q, now); err != nil {
			return err
		}
		for _, s := range serials {
			if err := q.Notify(ctx, store.ChannelRevocations, s); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	a.Revoked.Add(serials...)
	return identityProto(id), nil
}

func (a *adminServer) ListAudit(ctx context.Context, req *v1.ListAuditRequest) (*v1.ListAuditResponse, error) {
	f := store.AuditFilter{Identity: req.Identity, AfterID: req.AfterId, Limit: int(req.PageSize)}
	if req.PageSize < 0 {
		return nil, fail.Invalid("page_size", "must not be negative")
	}
	if req.Since != nil {
		f.Since = req.Since.AsTime()
	}
	rs, err := a.Store.ListAudit(ctx, f)
	if err != nil {
		return nil, err
	}
	out := &v1.ListAuditResponse{}
	for _, r := range rs {
		out.Records = append(out.Records, &v1.AuditRecord{Id: r.ID, At: tsp(r.At), Identity: r.Identity, Role: r.Role.String(), Serial: r.Serial,
			Method: r.Method, Target: r.Target, Code: r.Code})
	}
	return out, nil
}

func identityProto(id *store.AdminIdentity) *v1.AdminIdentity {
	out := &v1.AdminIdentity{Name: id.Name, Role: id.Role.String(), Serial: id.Serial, NotAfter: tsp(id.NotAfter), CreatedAt: tsp(id.CreatedAt)}
	if !id.RevokedAt.IsZero() {
		out.RevokedAt = tsp(id.RevokedAt)
	}
	return out
}
