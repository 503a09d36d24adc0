package ca_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/pki"
	"github.com/tetherfleet/tether/pki/ca"
)

// The rotation's certificates, checked the way nodes check them: the
// bundle's cross certificates chain each new root to the pin, and the
// server's chain after an activate (a leaf of the active CA, then each
// root with its cross certificate) verifies for a node pinned to any of
// them through pki.ServerRoots, and for one pinned to the active root
// with crypto/x509 alone.
func TestRotationChains(t *testing.T) {
	now := time.Now()
	clk := clock.NewFake(now)
	first, err := ca.Create(filepath.Join(t.TempDir(), "ca"), "Tether CA", clk)
	if err != nil {
		t.Fatal(err)
	}
	r1, k1 := first.Certificate(), first.Key()
	r2, k2, err := ca.GenerateRoot("Tether CA 2", ca.KeyP256, now)
	if err != nil {
		t.Fatal(err)
	}
	r3, k3, err := ca.GenerateRoot("Tether CA 3", ca.KeyEd25519, now)
	if err != nil {
		t.Fatal(err)
	}
	x2, err := ca.CrossSign(r1, k1, r2, now)
	if err != nil {
		t.Fatal(err)
	}
	x3, err := ca.CrossSign(r2, k2, r3, now)
	if err != nil {
		t.Fatal(err)
	}
	_ = k3
	bundle := []pki.BundleRoot{{Root: r1}, {Root: r2, Cross: x2}, {Root: r3, Cross: x3}}

	// Pinned to the first: both newer roots, the third through the second.
	got, refused := pki.ExtendTrust(map[string]bool{pki.Fingerprint(r1.Raw): true}, bundle, now)
	if len(got) != 3 || len(refused) != 0 {
		t.Fatalf("pinned to the first: %d accepted, refused %v", len(got), refused)
	}
	// Pinned to the third: the older ones have no cross from it.
	got, refused = pki.ExtendTrust(map[string]bool{pki.Fingerprint(r3.Raw): true}, bundle, now)
	if len(got) != 1 || len(refused) != 2 || !errors.Is(refused[0], pki.ErrNoCross) {
		t.Fatalf("pinned to the third: %d accepted, refused %v", len(got), refused)
	}

	// Roots a pin must refuse.
	rogue, rogueKey, _ := ca.GenerateRoot("Tether CA 2", ca.KeyP256, now)
	selfCross, _ := ca.CrossSign(rogue, rogueKey, rogue, now)
	wrongName, _ := ca.CrossSign(r1, k1, r2, now)
	otherKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	// Says the first root signed it: its name and key id, another key.
	impostor := *r1
	impostor.PublicKey = otherKey.Public()
	forged, err := ca.CrossSign(&impostor, otherKey, rogue, now)
	if err != nil {
		t.Fatal(err)
	}
	stale, _ := ca.CrossSign(r1, k1, rogue, now)
	later := now.Add(11 * 365 * 24 * time.Hour)
	for _, tc := range []struct {
		name string
		b    pki.BundleRoot
		at   time.Time
		says string
	}{
		{"cross-signed by itself", pki.BundleRoot{Root: rogue, Cross: selfCross}, now, "signed by no trusted root"},
		{"a cross certificate of another CA", pki.BundleRoot{Root: rogue, Cross: wrongName}, now, "names another CA"},
		{"a forged signature", pki.BundleRoot{Root: rogue, Cross: forged}, now, "signed by no trusted root"},
		{"an expired cross certificate", pki.BundleRoot{Root: rogue, Cross: stale}, later, "valid from"},
		{"no cross certificate", pki.BundleRoot{Root: rogue}, now, "no cross certificate"},
		{"a leaf as a root", pki.BundleRoot{Root: x2Leaf(t, first), Cross: x2}, now, "not a self-signed CA"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, refused := pki.ExtendTrust(map[string]bool{pki.Fingerprint(r1.Raw): true}, []pki.BundleRoot{{Root: r1}, tc.b}, tc.at)
			if len(got) != 1 || len(refused) != 1 || !strings.Contains(refused[0].Error(), tc.says) {
				t.Fatalf("%d accepted, refused %v; want it refused saying %q", len(got), refused, tc.says)
			}
		})
	}

	// The server's chain, for a node pinned to each root: a fresh node
	// knows only the fingerprint.
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	firstLeaf, err := first.SignServer([]string{"127.0.0.1"}, leafKey.Public())
	if err != nil {
		t.Fatal(err)
	}
	third, err := ca.New(r3, k3, clk)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := third.ReissueServer(firstLeaf)
	if err != nil {
		t.Fatal(err)
	}
	if !leaf.NotAfter.Equal(firstLeaf.NotAfter) || leaf.PublicKey.(*ecdsa.PublicKey).Equal(leafKey.Public()) == false || leaf.IPAddresses[0].String() != "127.0.0.1" {
		t.Fatalf("reissued leaf: %v %v %v", leaf.NotAfter, leaf.PublicKey, leaf.IPAddresses)
	}
	presented := []*x509.Certificate{leaf, r3, x3, r2, x2, r1}
	verify := func(roots []*x509.Certificate) error {
		pool, inter := x509.NewCertPool(), x509.NewCertPool()
		for _, r := range roots {
			pool.AddCert(r)
		}
		for _, c := range presented[1:] {
			inter.AddCert(c)
		}
		_, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, DNSName: "127.0.0.1",
			CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		return err
	}
	for i, root := range []*x509.Certificate{r1, r2, r3} {
		roots := pki.ServerRoots(presented, map[string]bool{pki.Fingerprint(root.Raw): true}, nil, now)
		if err := verify(roots); err != nil {
			t.Fatalf("pinned to root %d: %v", i+1, err)
		}
	}
	if err := verify([]*x509.Certificate{r3}); err != nil {
		t.Fatalf("pinned to the active root, crypto/x509 alone: %v", err)
	}
	// A pin the chain does not lead to finds nothing to trust.
	if roots := pki.ServerRoots(presented, map[string]bool{pki.Fingerprint(rogue.Raw): true}, nil, now); len(roots) != 0 {
		t.Fatalf("a foreign pin trusts %d roots", len(roots))
	}
	// Without the cross certificates an old pin cannot reach the new leaf.
	if roots := pki.ServerRoots([]*x509.Certificate{leaf, r3, r2, r1}, map[string]bool{pki.Fingerprint(r1.Raw): true}, nil, now); verify(roots) == nil {
		t.Fatal("verified without a cross certificate")
	}
}

// x2Leaf is a node certificate: no CA.
func x2Leaf(t *testing.T, c *ca.CA) *x509.Certificate {
	t.Helper()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf, err := c.SignServer([]string{"x"}, k.Public())
	if err != nil {
		t.Fatal(err)
	}
	return leaf
}
