package pki

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
)

// Module signing. Both ends use this file: tetherctl signs, tetherd checks
// a signature at push, and the agent checks it again before it mounts, so
// the signed message and the signer fingerprint have exactly one definition.

// ModuleMessage is what a signer's key signs for a module: the name, the
// version and the content digest, so a signature over one module never
// passes for another version or another image.
func ModuleMessage(name, version, digest string) []byte {
	return []byte("tether-module-v1\n" + name + "\n" + version + "\n" + digest)
}

// SignerFingerprint is "sha256:<hex>" over the raw 32-byte Ed25519 public
// key. It is what anchors (tether.signers=, fw_cfg opt/tether/signers) and
// templates (--require-signer) name.
func SignerFingerprint(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// ParseSignerFingerprint normalises one signer fingerprint.
func ParseSignerFingerprint(s string) (string, error) {
	fp, err := ParseFingerprint(s)
	if err != nil {
		return "", fmt.Errorf("signer %s", strings.TrimPrefix(err.Error(), "CA "))
	}
	return fp, nil
}

// ParseSignerList parses "sha256:FP[,sha256:FP]" into normalised, de-duplicated
// fingerprints. An empty string is an empty list.
func ParseSignerList(s string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, part := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' || r == '\r' }) {
		fp, err := ParseSignerFingerprint(part)
		if err != nil {
			return nil, err
		}
		if !seen[fp] {
			seen[fp] = true
			out = append(out, fp)
		}
	}
	return out, nil
}

// SignModule signs (name, version, digest) with key.
func SignModule(key ed25519.PrivateKey, name, version, digest string) []byte {
	return ed25519.Sign(key, ModuleMessage(name, version, digest))
}

// VerifyModule reports whether sig is pub's signature over (name, version,
// digest). A key or signature of the wrong size never verifies.
func VerifyModule(pub []byte, name, version, digest string, sig []byte) bool {
	return len(pub) == ed25519.PublicKeySize && len(sig) == ed25519.SignatureSize &&
		ed25519.Verify(ed25519.PublicKey(pub), ModuleMessage(name, version, digest), sig)
}

// GenerateSigner makes a new Ed25519 signing key.
func GenerateSigner() (ed25519.PublicKey, ed25519.PrivateKey, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate signer key: %w", err)
	}
	return pub, priv, nil
}

// SignerPublicPEM encodes a signer's public key as a PEM PUBLIC KEY (PKIX),
// the form openssl and `tetherd --module-signing-key` read.
func SignerPublicPEM(pub ed25519.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("encode signer public key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

// SignerPrivatePEM encodes a signer's private key as a PEM PRIVATE KEY (PKCS#8).
func SignerPrivatePEM(key ed25519.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode signer private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParseSignerPublicKey accepts a raw 32-byte Ed25519 public key or a PEM
// PUBLIC KEY.
func ParseSignerPublicKey(b []byte) (ed25519.PublicKey, error) {
	if len(b) == ed25519.PublicKeySize {
		return ed25519.PublicKey(append([]byte(nil), b...)), nil
	}
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "PUBLIC KEY" {
		return nil, errors.New("want a 32-byte Ed25519 public key or a PEM PUBLIC KEY (from `tetherctl signer create`)")
	}
	k, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse public key: %w", err)
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("the public key is a %T, not Ed25519", k)
	}
	return pub, nil
}

// ParseSignerPrivateKey reads a PEM PRIVATE KEY holding an Ed25519 key.
func ParseSignerPrivateKey(b []byte) (ed25519.PrivateKey, error) {
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, errors.New("want a PEM PRIVATE KEY (the signer.key `tetherctl signer create` wrote)")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse private key: %w", err)
	}
	key, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("the private key is a %T, not Ed25519", k)
	}
	return key, nil
}
