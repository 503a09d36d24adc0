package ca

import (
	"bytes"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"io"
	"math/big"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/internal/clock"
)

func testCA(t *testing.T, kt KeyType) *CA {
	t.Helper()
	c, err := CreateWithKey(t.TempDir(), "test", clock.NewFake(time.Now()), kt)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// createCertificate's body is crypto/x509's, byte for byte, and every
// certificate it makes verifies against the CA, checked or not.
func TestCreateCertificateMatchesCryptoX509(t *testing.T) {
	nodePub, _, _ := ed25519.GenerateKey(rand.Reader)
	for _, kt := range []KeyType{KeyP256, KeyEd25519} {
		t.Run(string(kt), func(t *testing.T) {
			c := testCA(t, kt)
			now := time.Now().Truncate(time.Second)
			for i := range 3 * checkEvery {
				tpl := &x509.Certificate{
					// Serials of every length, the high bit set or not.
					SerialNumber: new(big.Int).Lsh(big.NewInt(int64(i+1)), uint(i%130)),
					URIs:         []*url.URL{{Scheme: "tether", Host: "instance", Path: "/i" + string(rune('a'+i%26))}},
					NotBefore:    now.Add(-time.Minute),
					NotAfter:     now.Add(time.Duration(i) * time.Hour),
					KeyUsage:     x509.KeyUsageDigitalSignature,
					ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
					SubjectKeyId: []byte{byte(i), 2, 3},
				}
				ours, err := c.createCertificate(c.cur.Load(), tpl, nodePub)
				if err != nil {
					t.Fatalf("certificate %d: %v", i, err)
				}
				theirs, err := x509.CreateCertificate(rand.Reader, tpl, c.Certificate(), nodePub, c.cur.Load().key)
				if err != nil {
					t.Fatal(err)
				}
				got := ours
				want, _ := x509.ParseCertificate(theirs)
				if !bytes.Equal(got.RawTBSCertificate, want.RawTBSCertificate) {
					t.Fatalf("certificate %d: body differs from crypto/x509's", i)
				}
				if got.SignatureAlgorithm != want.SignatureAlgorithm {
					t.Fatalf("certificate %d: signature algorithm %s, want %s", i, got.SignatureAlgorithm, want.SignatureAlgorithm)
				}
				// Ed25519 signatures are deterministic: the whole
				// certificate is the same.
				if kt == KeyEd25519 && !bytes.Equal(ours.Raw, theirs) {
					t.Fatalf("certificate %d: DER differs from crypto/x509's", i)
				}
				if err := got.CheckSignatureFrom(c.Certificate()); err != nil {
					t.Fatalf("certificate %d: %v", i, err)
				}
			}
		})
	}
}

// corrupting flips a bit of every signature its key makes.
type corrupting struct{ crypto.Signer }

func (s corrupting) Sign(r io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	sig, err := s.Signer.Sign(r, digest, opts)
	if err == nil {
		sig[len(sig)-1] ^= 1
	}
	return sig, err
}

// failing refuses to sign.
type failing struct{ crypto.Signer }

func (failing) Sign(io.Reader, []byte, crypto.SignerOpts) ([]byte, error) {
	return nil, errors.New("the token is unplugged")
}

// A signer that is wrong every time is caught on the first certificate
// and on every checkEvery-th after it; one that fails says so.
func TestCreateCertificateChecksSignatures(t *testing.T) {
	base := testCA(t, KeyP256)
	nodePub, _, _ := ed25519.GenerateKey(rand.Reader)
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour),
		URIs: []*url.URL{{Scheme: "tether", Host: "instance", Path: "/i1"}}}

	bad, err := New(base.Certificate(), corrupting{base.cur.Load().key}, clock.NewFake(time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	var refused []int
	for i := range 2*checkEvery + 1 {
		if _, err := bad.createCertificate(bad.cur.Load(), tpl, nodePub); err != nil {
			if !strings.Contains(err.Error(), "does not verify") {
				t.Fatalf("certificate %d: err = %v, want a signature that does not verify", i, err)
			}
			refused = append(refused, i)
		}
	}
	if want := []int{0, checkEvery, 2 * checkEvery}; !slices.Equal(refused, want) {
		t.Fatalf("refused certificates %v, want %v", refused, want)
	}

	broken, err := New(base.Certificate(), failing{base.cur.Load().key}, clock.NewFake(time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := broken.createCertificate(broken.cur.Load(), tpl, nodePub); err == nil || !strings.Contains(err.Error(), "unplugged") {
		t.Fatalf("err = %v, want the signer's error", err)
	}
}
