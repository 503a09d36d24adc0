// Package identities serves the admin identity RPCs of AdminService and
// the audit trail's listing: who may call the admin API, with which role,
// and what they did. controlplane/certificates issues and revokes the
// identities; these handlers check the request's shape, act through it,
// and convert.
package identities

import (
	"context"
	"crypto/x509"
	"errors"
	"time"

	"github.com/tetherfleet/tether/controlplane/api/admin/adminkit"
	"github.com/tetherfleet/tether/controlplane/certificates"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/pki"
	"github.com/tetherfleet/tether/pki/ca"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// Reads are the store reads the listings use.
type Reads interface {
	ListAdminIdentities(ctx context.Context) ([]*store.AdminIdentity, error)
	ListAudit(ctx context.Context, f store.AuditFilter) ([]*store.AuditRecord, error)
}

// Revoked is this replica's revocation set: a revoked identity's
// certificates are refused here at once, before the store's notification
// comes back.
type Revoked interface {
	Add(serials ...store.CertSerial)
}

// Config is what the identity RPCs use (all required).
type Config struct {
	Certificates *certificates.Service
	Reads        Reads
	Revoked      Revoked
	Clock        clock.Clock
}

// Server serves the identity and audit RPCs.
type Server struct {
	cfg Config
}

// New builds the identity RPCs, naming a missing dependency.
func New(cfg Config) (*Server, error) {
	for _, r := range []struct {
		name    string
		missing bool
	}{{"Certificates", cfg.Certificates == nil}, {"Reads", cfg.Reads == nil}, {"Revoked", cfg.Revoked == nil}, {"Clock", cfg.Clock == nil}} {
		if r.missing {
			return nil, errors.New("identities: Config." + r.name + " is required")
		}
	}
	return &Server{cfg: cfg}, nil
}

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

func (a *Server) issue(ctx context.Context, in certificates.IdentityIssue) (*v1.IdentityCertificate, error) {
	in.By = adminkit.By(ctx)
	got, err := a.cfg.Certificates.IssueIdentity(ctx, in)
	if err != nil {
		return nil, err
	}
	return &v1.IdentityCertificate{Identity: identityProto(got.Identity), CertificatePem: string(ca.CertPEM(got.Cert)),
		CaPem: string(ca.CertPEM(got.Issuer))}, nil
}

// CreateIdentity implements AdminService.
func (a *Server) CreateIdentity(ctx context.Context, req *v1.CreateIdentityRequest) (*v1.IdentityCertificate, error) {
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
	return a.issue(ctx, certificates.IdentityIssue{Name: req.Name, Role: role, Key: csr.PublicKey, TTL: ttl})
}

// RenewIdentity issues the caller a fresh certificate with the same name
// and role: an identity can renew only itself, and never raise its role.
// Nor can it outlive what the admin granted: the new certificate ends no
// later than the one renewing (ADR 0018), so renewal rotates the key and
// the lifetime stays the admin's choice.
func (a *Server) RenewIdentity(ctx context.Context, req *v1.RenewIdentityRequest) (*v1.IdentityCertificate, error) {
	c, ok := adminkit.CallerFrom(ctx)
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
	granted := c.NotAfter.Sub(a.cfg.Clock.Now())
	if granted < time.Second {
		return nil, fail.Precondition("identity %q was granted until %s; only an admin can mint it a new identity", c.Identity.Name, c.NotAfter.UTC().Format(time.RFC3339))
	}
	ttl = min(ttl, granted)
	return a.issue(ctx, certificates.IdentityIssue{Name: c.Identity.Name, Role: store.Role(c.Identity.Role), Key: csr.PublicKey, TTL: ttl, Renew: true})
}

// ListIdentities implements AdminService.
func (a *Server) ListIdentities(ctx context.Context, _ *v1.ListIdentitiesRequest) (*v1.ListIdentitiesResponse, error) {
	ids, err := a.cfg.Reads.ListAdminIdentities(ctx)
	if err != nil {
		return nil, err
	}
	out := &v1.ListIdentitiesResponse{}
	for _, id := range ids {
		out.Identities = append(out.Identities, identityProto(id))
	}
	return out, nil
}

// RevokeIdentity revokes every certificate the identity was ever issued;
// the next call of any of them is refused on every replica, and on this
// one at once.
func (a *Server) RevokeIdentity(ctx context.Context, req *v1.RevokeIdentityRequest) (*v1.AdminIdentity, error) {
	if req.Name == "" {
		return nil, fail.Invalid("name", "required")
	}
	id, serials, err := a.cfg.Certificates.RevokeAdminIdentity(ctx, req.Name, adminkit.By(ctx))
	if err != nil {
		return nil, err
	}
	a.cfg.Revoked.Add(serials...)
	return identityProto(id), nil
}

// ListAudit implements AdminService.
func (a *Server) ListAudit(ctx context.Context, req *v1.ListAuditRequest) (*v1.ListAuditResponse, error) {
	f := store.AuditFilter{Identity: req.Identity, AfterID: req.AfterId, Limit: int(req.PageSize)}
	if req.PageSize < 0 {
		return nil, fail.Invalid("page_size", "must not be negative")
	}
	if req.Since != nil {
		f.Since = req.Since.AsTime()
	}
	rs, err := a.cfg.Reads.ListAudit(ctx, f)
	if err != nil {
		return nil, err
	}
	out := &v1.ListAuditResponse{}
	for _, r := range rs {
		out.Records = append(out.Records, &v1.AuditRecord{Id: r.ID, At: adminkit.Timestamp(r.At), Identity: r.Identity, Role: r.Role.String(),
			Serial: r.Serial.String(), Method: r.Method, Target: r.Target, Code: r.Code})
	}
	return out, nil
}

func identityProto(id *store.AdminIdentity) *v1.AdminIdentity {
	out := &v1.AdminIdentity{Name: id.Name, Role: id.Role.String(), Serial: id.Serial.String(), NotAfter: adminkit.Timestamp(id.NotAfter),
		CreatedAt: adminkit.Timestamp(id.CreatedAt)}
	if !id.RevokedAt.IsZero() {
		out.RevokedAt = adminkit.Timestamp(id.RevokedAt)
	}
	return out
}
