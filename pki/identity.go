// Package pki holds the identity conventions shared by the control plane and
// the agent: certificate identities (URI SANs), CA fingerprints and token
// hashing. It must stay light: the agent imports it, so nothing here may pull
// in the signing authority (that lives in pki/ca).
package pki

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// URIScheme is the scheme of every identity URI SAN Tether issues.
const URIScheme = "tether"

// Identity kinds, the host part of the URI SAN.
const (
	KindInstance = "instance"
	KindAdmin    = "admin"
	KindServer   = "server"
)

// Identity is who a certificate speaks for.
type Identity struct {
	Kind string // KindInstance, KindAdmin or KindServer
	// Name is the instance id for nodes, the admin's name for admins.
	Name string
	// Role is set for admins: viewer, operator or admin.
	Role string
}

// URI renders the identity as its URI SAN: tether://instance/<id> or
// tether://admin/<name>?role=<role>.
func (id Identity) URI() *url.URL {
	u := &url.URL{Scheme: URIScheme, Host: id.Kind, Path: "/" + id.Name}
	if id.Role != "" {
		u.RawQuery = url.Values{"role": {id.Role}}.Encode()
	}
	return u
}

func (id Identity) String() string { return id.URI().String() }

// InstanceURI is the URI SAN of a node certificate.
func InstanceURI(instanceID string) *url.URL {
	return Identity{Kind: KindInstance, Name: instanceID}.URI()
}

// ParseIdentityURI parses a tether:// URI SAN.
func ParseIdentityURI(u *url.URL) (Identity, error) {
	if u == nil || u.Scheme != URIScheme {
		return Identity{}, errors.New("not a tether identity URI")
	}
	name := strings.TrimPrefix(u.Path, "/")
	if name == "" || strings.Contains(name, "/") {
		return Identity{}, fmt.Errorf("identity URI %q: bad name", u)
	}
	switch u.Host {
	case KindInstance, KindServer:
		return Identity{Kind: u.Host, Name: name}, nil
	case KindAdmin:
		role := u.Query().Get("role")
		if role == "" {
			role = "admin"
		}
		return Identity{Kind: KindAdmin, Name: name, Role: role}, nil
	default:
		return Identity{}, fmt.Errorf("identity URI %q: unknown kind %q", u, u.Host)
	}
}

// IdentityOf returns the identity of a certificate: its one tether:// URI SAN.
func IdentityOf(cert *x509.Certificate) (Identity, error) {
	var found []Identity
	for _, u := range cert.URIs {
		if u.Scheme != URIScheme {
			continue
		}
		id, err := ParseIdentityURI(u)
		if err != nil {
			return Identity{}, err
		}
		found = append(found, id)
	}
	switch len(found) {
	case 0:
		return Identity{}, errors.New("certificate has no tether identity")
	case 1:
		return found[0], nil
	default:
		return Identity{}, errors.New("certificate has more than one tether identity")
	}
}

// Fingerprint is "sha256:<hex>" over a certificate's DER bytes, the same
// value `openssl x509 -outform der | sha256sum` prints.
func Fingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// ParseFingerprint accepts "sha256:<64 hex>" (or the bare hex) and returns the
// normalised form.
func ParseFingerprint(s string) (string, error) {
	h := strings.ToLower(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(s), "sha256:")))
	if len(h) != 64 {
		return "", fmt.Errorf("CA fingerprint %q: want sha256:<64 hex digits>", s)
	}
	if _, err := hex.DecodeString(h); err != nil {
		return "", fmt.Errorf("CA fingerprint %q: not hex", s)
	}
	return "sha256:" + h, nil
}

// FingerprintMatches compares a certificate to a pinned fingerprint in
// constant time.
func FingerprintMatches(der []byte, pinned string) bool {
	return subtle.ConstantTimeCompare([]byte(Fingerprint(der)), []byte(pinned)) == 1
}
