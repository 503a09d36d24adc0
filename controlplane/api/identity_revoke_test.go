package api_test

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/tetherfleet/tether/internal/testkit/testcp"
	"github.com/tetherfleet/tether/pki/ca"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// mint creates an identity with a lifetime, as `identity create --ttl`.
func mint(t *testing.T, cp *testcp.ControlPlane, name, role string, ttl time.Duration) tls.Certificate {
	t.Helper()
	key := testcp.NewNodeKey(t)
	resp, err := cp.Admin.CreateIdentity(ctxT(t), &v1.CreateIdentityRequest{Name: name, Role: role, CsrPem: key.CSRPEM, TtlSeconds: int64(ttl / time.Second)})
	if err != nil {
		t.Fatalf("create identity %s: %v", name, err)
	}
	return key.Certificate(t, resp.CertificatePem)
}

// A renewal rotates the key but may not outlive what the admin granted:
// a viewer minted for 24 h that asks for 366 days gets no later end.
func TestRenewalKeepsTheGrantedLifetime(t *testing.T) {
	cp := testcp.Start(t)
	ctx := ctxT(t)
	first := mint(t, cp, "vera", "viewer", 24*time.Hour)
	key := testcp.NewNodeKey(t)
	ren, err := v1.NewAdminServiceClient(cp.Dial(&first)).RenewIdentity(ctx, &v1.RenewIdentityRequest{CsrPem: key.CSRPEM, TtlSeconds: int64(366 * 24 * time.Hour / time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	renewed := key.Certificate(t, ren.CertificatePem)
	if renewed.Leaf.NotAfter.After(first.Leaf.NotAfter) {
		t.Fatalf("renewed certificate ends %s, after the granted %s", renewed.Leaf.NotAfter, first.Leaf.NotAfter)
	}
	if renewed.Leaf.SerialNumber.Cmp(first.Leaf.SerialNumber) == 0 {
		t.Fatal("renewal kept the serial")
	}
	// Renewing the renewal gains nothing either.
	key2 := testcp.NewNodeKey(t)
	ren2, err := v1.NewAdminServiceClient(cp.Dial(&renewed)).RenewIdentity(ctx, &v1.RenewIdentityRequest{CsrPem: key2.CSRPEM})
	if err != nil {
		t.Fatal(err)
	}
	if end := ren2.Identity.NotAfter.AsTime(); end.After(first.Leaf.NotAfter) {
		t.Fatalf("second renewal ends %s, after the granted %s", end, first.Leaf.NotAfter)
	}
}

// Revoking an identity revokes every certificate it ever held, not only
// the latest, and ends the streams open with any of them.
func TestRevokeIdentityRevokesEveryCertificate(t *testing.T) {
	cp := testcp.Start(t)
	ctx := ctxT(t)
	old := mint(t, cp, "otto", "operator", 0)
	oldAdmin := v1.NewAdminServiceClient(cp.Dial(&old))
	key := testcp.NewNodeKey(t)
	ren, err := oldAdmin.RenewIdentity(ctx, &v1.RenewIdentityRequest{CsrPem: key.CSRPEM})
	if err != nil {
		t.Fatal(err)
	}
	renewed := key.Certificate(t, ren.CertificatePem)
	newAdmin := v1.NewAdminServiceClient(cp.Dial(&renewed))
	// Both certificates work until the revoke; each holds an open watch.
	// Without the cut a watch would wait for ever; its deadline makes
	// that a failure.
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	var watches []v1.AdminService_WatchEventsClient
	for _, c := range []v1.AdminServiceClient{oldAdmin, newAdmin} {
		if _, err := c.ListNodes(ctx, &v1.ListNodesRequest{}); err != nil {
			t.Fatal(err)
		}
		w, err := c.WatchEvents(wctx, &v1.WatchEventsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		watches = append(watches, w)
	}
	// An event reaches both watches: they are open and authenticated.
	cp.SeedFleet(ctx, "edge")
	for i, w := range watches {
		if _, err := w.Recv(); err != nil {
			t.Fatalf("watch %d before revoke: %v", i, err)
		}
	}
	rev, err := cp.Admin.RevokeIdentity(ctx, &v1.RevokeIdentityRequest{Name: "otto"})
	if err != nil {
		t.Fatal(err)
	}
	if rev.RevokedAt == nil {
		t.Fatalf("revoked identity = %v", rev)
	}
	for _, c := range []v1.AdminServiceClient{oldAdmin, newAdmin} {
		_, err := c.ListNodes(ctx, &v1.ListNodesRequest{})
		wantMsg(t, err, codes.Unauthenticated, "revoked")
	}
	for _, w := range watches {
		for {
			_, err := w.Recv()
			if err == nil {
				continue // events written up to the revoke may still arrive
			}
			wantMsg(t, err, codes.Unauthenticated, "revoked")
			break
		}
	}
	// Both serials are listed as revoked.
	certs, err := cp.Admin.ListCertificates(ctx, &v1.ListCertificatesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	revoked := map[string]bool{}
	for _, c := range certs.Certificates {
		revoked[c.Serial] = c.RevokedAt != nil
	}
	for _, c := range []tls.Certificate{old, renewed} {
		serial := ca.SerialString(c.Leaf)
		if v, ok := revoked[serial]; !ok || !v {
			t.Errorf("certificate %s: listed %v, revoked %v", serial, ok, v)
		}
	}
}
