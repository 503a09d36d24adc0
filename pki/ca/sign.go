package ca

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"io"

	"golang.org/x/crypto/cryptobyte"
	cbasn1 "golang.org/x/crypto/cryptobyte/asn1"
)

// checkEvery is how often createCertificate checks a signature it made:
// the first, then one in checkEvery.
const checkEvery = 64

// errTBSCaptured stops x509.CreateCertificate once it has handed the
// certificate body to tbsCapture for signing.
var errTBSCaptured = errors.New("certificate body captured")

// tbsCapture is a crypto.MessageSigner that keeps the message it is asked
// to sign (the DER TBSCertificate) and signs nothing.
type tbsCapture struct {
	pub  crypto.PublicKey
	tbs  []byte
	opts crypto.SignerOpts
}

func (t *tbsCapture) Public() crypto.PublicKey { return t.pub }

func (t *tbsCapture) Sign(io.Reader, []byte, crypto.SignerOpts) ([]byte, error) {
	return nil, errors.New("tbsCapture signs messages only")
}

func (t *tbsCapture) SignMessage(_ io.Reader, msg []byte, opts crypto.SignerOpts) ([]byte, error) {
	t.tbs, t.opts = msg, opts
	return nil, errTBSCaptured
}

// createCertificate is x509.CreateCertificate with the CA's key, less the
// check crypto/x509 makes of every signature it has just made. That check
// guards against a faulty crypto.Signer (an HSM, a KMS); for this CA's
// in-memory key it cost twice the signature itself, 13 % of tetherd's CPU
// per enrollment (docs/benchmarks.md). crypto/x509 still builds and
// encodes the whole body; only the signature and the outer SEQUENCE are
// done here. The first signature and one in checkEvery after it are still
// checked, so a signer that is wrong every time is caught at once.
//
// It returns the certificate parsed, since SignNode needs it so and the
// check reads it so.
func (c *CA) createCertificate(r *roster, tpl *x509.Certificate, pub crypto.PublicKey) (*x509.Certificate, error) {
	capture := &tbsCapture{pub: r.key.Public()}
	_, err := x509.CreateCertificate(rand.Reader, tpl, r.cert, pub, capture)
	if !errors.Is(err, errTBSCaptured) {
		if err == nil {
			err = errors.New("crypto/x509 did not ask for a signature")
		}
		return nil, err
	}
	alg, err := signatureAlgorithm(capture.tbs)
	if err != nil {
		return nil, err
	}
	sig, err := crypto.SignMessage(r.key, rand.Reader, capture.tbs, capture.opts)
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	var b cryptobyte.Builder
	b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
		b.AddBytes(capture.tbs)
		b.AddBytes(alg)
		b.AddASN1BitString(sig)
	})
	der, err := b.Bytes()
	if err != nil {
		return nil, fmt.Errorf("encode certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse the new certificate: %w", err)
	}
	if c.signed.Add(1)%checkEvery == 1 {
		if err := cert.CheckSignatureFrom(r.cert); err != nil {
			return nil, fmt.Errorf("the CA key's signature does not verify: %w", err)
		}
	}
	return cert, nil
}

// signatureAlgorithm returns the DER AlgorithmIdentifier inside a
// TBSCertificate: the certificate repeats it outside the body.
func signatureAlgorithm(tbs []byte) ([]byte, error) {
	in := cryptobyte.String(tbs)
	var body, alg cryptobyte.String
	if !in.ReadASN1(&body, cbasn1.SEQUENCE) ||
		!body.SkipOptionalASN1(cbasn1.Tag(0).Constructed().ContextSpecific()) ||
		!body.SkipASN1(cbasn1.INTEGER) ||
		!body.ReadASN1Element(&alg, cbasn1.SEQUENCE) {
		return nil, errors.New("encode certificate: malformed certificate body from crypto/x509")
	}
	return alg, nil
}
