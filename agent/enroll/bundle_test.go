package enroll

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/agent/enroll/enrolltest"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// crossSign is root's name and key signed by by: what a rotation's
// prepare makes.
func crossSign(t *testing.T, by, root *enrolltest.CA) string {
	t.Helper()
	tpl := &x509.Certificate{SerialNumber: root.Cert.SerialNumber, Subject: root.Cert.Subject, SubjectKeyId: root.Cert.SubjectKeyId,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: root.Cert.KeyUsage}
	der, err := x509.CreateCertificate(rand.Reader, tpl, by.Cert, root.Cert.PublicKey, by.Key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return enrolltest.PEMOf(c)
}

// A bundle widens the pin only along cross certificates the pin signed,
// the roots learnt survive a restart of the agent (bundle.json, checked
// again), and an identity issued by the new root loads under the old pin.
func TestTrustBundleChainsToThePin(t *testing.T) {
	f := newFixture(t)
	second := enrolltest.NewCA(t, "second")
	rogue := enrolltest.NewCA(t, "rogue")
	m := f.manager(t, f.ca.Fingerprint)

	m.ApplyBundle(&tetherv1.TrustBundle{ActiveFingerprint: rogue.Fingerprint, Roots: []*tetherv1.TrustedRoot{
		{CertificatePem: f.ca.PEM},
		{CertificatePem: rogue.PEM, CrossPem: crossSign(t, rogue, rogue)},
		{CertificatePem: rogue.PEM, CrossPem: crossSign(t, second, rogue)},
	}})
	if m.Pin().Trusts(rogue.Fingerprint) {
		t.Fatal("a root cross-signed by nothing trusted was accepted")
	}
	f.logs.waitFor(t, "refused")
	if _, err := os.Stat(filepath.Join(f.dir, BundleFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a bundle that added nothing was saved: %v", err)
	}

	m.ApplyBundle(&tetherv1.TrustBundle{ActiveFingerprint: second.Fingerprint, Roots: []*tetherv1.TrustedRoot{
		{CertificatePem: f.ca.PEM}, {CertificatePem: second.PEM, CrossPem: crossSign(t, f.ca, second)},
	}})
	if !m.Pin().Trusts(second.Fingerprint) {
		t.Fatal("the root the pin cross-signed was not accepted")
	}
	f.logs.waitFor(t, "now trusting CA "+second.Fingerprint)

	// An identity of the new root, saved as a renewal saves it.
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	cert, err := second.IssueNode(pub, "i-1", time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	id, err := newIdentity(key, cert, second.Cert)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.commit(id, savedMeta{}); err != nil {
		t.Fatal(err)
	}

	// The agent after the switch of root: the same pin, the saved state.
	after := f.manager(t, f.ca.Fingerprint)
	if _, err := after.Load(); err != nil {
		t.Fatalf("load under the old pin with the saved bundle: %v", err)
	}
	if !after.Pin().Trusts(second.Fingerprint) {
		t.Fatal("the saved bundle was not trusted again")
	}

	// Retire: the bundle lists the new root alone. The pinned root is
	// trusted no more, on this agent and on the next one to load.
	after.ApplyBundle(&tetherv1.TrustBundle{ActiveFingerprint: second.Fingerprint, Roots: []*tetherv1.TrustedRoot{
		{CertificatePem: second.PEM, CrossPem: crossSign(t, f.ca, second)},
	}})
	if after.Pin().Trusts(f.ca.Fingerprint) || !after.Pin().Trusts(second.Fingerprint) {
		t.Fatal("after retire: the retired pin is still trusted, or the active root is not")
	}
	f.logs.waitFor(t, "was retired")
	// A bundle of nothing that chains changes nothing.
	after.ApplyBundle(&tetherv1.TrustBundle{Roots: []*tetherv1.TrustedRoot{{CertificatePem: rogue.PEM}}})
	if !after.Pin().Trusts(second.Fingerprint) {
		t.Fatal("a bundle of foreign roots emptied the node's trust")
	}
	reloaded := f.manager(t, f.ca.Fingerprint)
	if _, err := reloaded.Load(); err != nil {
		t.Fatal(err)
	}
	if reloaded.Pin().Trusts(f.ca.Fingerprint) || !reloaded.Pin().Trusts(second.Fingerprint) {
		t.Fatal("after a reload: the retired pin is trusted again, or the active root is not")
	}

	// A bundle file tampered with to name another root is checked again
	// and refused: the identity of that root does not load.
	if err := os.WriteFile(filepath.Join(f.dir, BundleFile), []byte(`{"entries":[{"root_pem":`+quote(rogue.PEM)+`,"cross_pem":`+quote(crossSign(t, rogue, rogue))+`}],"trusted":[`+quote(rogue.Fingerprint)+`]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	tampered := f.manager(t, f.ca.Fingerprint)
	if _, err := tampered.Load(); err == nil || !strings.Contains(err.Error(), "no trust bundle chained it") {
		t.Fatalf("load with a tampered bundle: %v", err)
	}
}

func quote(s string) string {
	return `"` + strings.ReplaceAll(s, "\n", `\n`) + `"`
}
