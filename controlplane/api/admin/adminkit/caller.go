package adminkit

import (
	"context"
	"crypto"
	"time"

	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/pki"
)

// Caller is the authenticated peer of a call.
type Caller struct {
	Identity  pki.Identity
	Serial    store.CertSerial
	NotAfter  time.Time
	PublicKey crypto.PublicKey
}

type callerKey struct{}

// CallerFrom returns the caller put in the context by the auth interceptor.
func CallerFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

// WithCaller puts the caller in the context: the auth interceptor does,
// and so do tests that call a resource's handlers directly.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerName names the caller for the records a call writes ("unknown"
// when the call names none).
func CallerName(ctx context.Context) string {
	if c, ok := CallerFrom(ctx); ok {
		return c.Identity.Name
	}
	return "unknown"
}

// By names the caller for the records a call writes ("" when the call
// names none).
func By(ctx context.Context) string {
	c, _ := CallerFrom(ctx)
	return c.Identity.Name
}

// Roles, weakest first (store.Role). The role is in the admin certificate.
const (
	RoleViewer   = store.RoleViewer
	RoleOperator = store.RoleOperator
	RoleAdmin    = store.RoleAdmin
)

// AtLeast reports whether role (a certificate's text) is min or stronger;
// an unknown role may do nothing.
func AtLeast(role string, min store.Role) bool { return store.Role(role).AtLeast(min) }

// NeedsAdmin refuses a caller below admin that sets what, for the reason
// why: some fields of a call an operator may make decide more than the
// call does (where a BMC password goes, which machine may enroll as a
// node).
func NeedsAdmin(ctx context.Context, what, why string) error {
	c, ok := CallerFrom(ctx)
	if !ok {
		return fail.Denied("setting %s needs role admin; the call names no caller", what)
	}
	if !AtLeast(c.Identity.Role, RoleAdmin) {
		return fail.Denied("setting %s needs role admin: %s; identity %s has role %s", what, why, c.Identity.Name, c.Identity.Role)
	}
	return nil
}
