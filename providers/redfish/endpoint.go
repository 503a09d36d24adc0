package redfish

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Scheme is how a node names its BMC: redfish://HOST[:PORT]/redfish/v1/Systems/ID.
// The BMC is always spoken to over HTTPS.
const Scheme = "redfish"

// Endpoint is a parsed BMC address.
type Endpoint struct {
	// Base is https://HOST[:PORT].
	Base *url.URL
	// SystemPath is the system's @odata.id, e.g. /redfish/v1/Systems/1;
	// empty means the BMC's only system.
	SystemPath string
}

// ParseEndpoint parses a node's BMC address.
func ParseEndpoint(s string) (Endpoint, error) {
	u, err := url.Parse(s)
	if err != nil {
		return Endpoint{}, fmt.Errorf("BMC address %q: %w", s, err)
	}
	switch {
	case u.Scheme != Scheme:
		return Endpoint{}, fmt.Errorf("BMC address %q: scheme must be %s:// (want redfish://HOST[:PORT]/redfish/v1/Systems/ID)", s, Scheme)
	case u.User != nil:
		// Said without echoing the address: it may hold a password.
		return Endpoint{}, errors.New("BMC address: holds user information; store the user name and password as a credential (tetherctl credential create) and name it with --bmc-credentials")
	case u.Host == "" || u.Hostname() == "":
		return Endpoint{}, fmt.Errorf("BMC address %q: no host", s)
	case u.RawQuery != "" || u.Fragment != "":
		return Endpoint{}, fmt.Errorf("BMC address %q: a query or fragment is not part of a BMC address", s)
	}
	if p := u.Port(); p != "" {
		if _, err := net.LookupPort("tcp", p); err != nil {
			return Endpoint{}, fmt.Errorf("BMC address %q: port %q: %w", s, p, err)
		}
	}
	path := strings.TrimRight(u.Path, "/")
	if path == "/redfish/v1" {
		path = ""
	}
	if path != "" && !strings.HasPrefix(path, "/redfish/v1/") {
		return Endpoint{}, fmt.Errorf("BMC address %q: path %q is not a Redfish resource (want /redfish/v1/Systems/ID)", s, u.Path)
	}
	return Endpoint{Base: &url.URL{Scheme: "https", Host: u.Host}, SystemPath: path}, nil
}

// TLS is how a BMC's certificate is verified.
type TLS struct {
	// CAPEM verifies the BMC's chain against these CA certificates
	// instead of the system's.
	CAPEM []byte
	// Fingerprint pins the BMC's own certificate: sha256:HEX over its DER.
	// With CAPEM both must hold; alone it replaces chain verification
	// (a BMC's self-signed certificate names no usable host).
	Fingerprint string
	// InsecureSkipVerify accepts any certificate (labs only; every use
	// raises a warning event).
	InsecureSkipVerify bool
}

// ParseFingerprint normalises sha256:HEX (any case, ':' separators allowed).
func ParseFingerprint(s string) (string, error) {
	rest, ok := strings.CutPrefix(strings.ToLower(strings.TrimSpace(s)), "sha256:")
	if !ok {
		return "", fmt.Errorf("fingerprint %q: want sha256:<64 hex digits>", s)
	}
	rest = strings.ReplaceAll(rest, ":", "")
	if b, err := hex.DecodeString(rest); err != nil || len(b) != sha256.Size {
		return "", fmt.Errorf("fingerprint %q: want sha256:<64 hex digits>", s)
	}
	return "sha256:" + rest, nil
}

// ParseCA parses PEM CA certificates, refusing input that holds none.
func ParseCA(pemBytes []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemBytes) {
		return nil, errors.New("no PEM certificate in the BMC CA")
	}
	return pool, nil
}

// Fingerprint is sha256:HEX over a certificate's DER bytes.
func Fingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Config builds the tls.Config of t.
func (t TLS) Config(serverName string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if t.InsecureSkipVerify {
		cfg.InsecureSkipVerify = true
		return cfg, nil
	}
	var roots *x509.CertPool
	if len(t.CAPEM) > 0 {
		var err error
		if roots, err = ParseCA(t.CAPEM); err != nil {
			return nil, err
		}
		cfg.RootCAs = roots
	}
	if t.Fingerprint == "" {
		return cfg, nil
	}
	pin, err := ParseFingerprint(t.Fingerprint)
	if err != nil {
		return nil, err
	}
	// The pin is checked by hand, so the library's own check is off; the
	// CA, when given, is verified by hand as well.
	cfg.InsecureSkipVerify = true
	cfg.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
		if len(raw) == 0 {
			return errors.New("the BMC sent no certificate")
		}
		got := Fingerprint(raw[0])
		if subtle.ConstantTimeCompare([]byte(got), []byte(pin)) != 1 {
			return fmt.Errorf("the BMC's certificate is %s, not the pinned %s: %w", got, pin, errPinMismatch)
		}
		if roots == nil {
			return nil
		}
		leaf, err := x509.ParseCertificate(raw[0])
		if err != nil {
			return fmt.Errorf("the BMC's certificate: %w", err)
		}
		inter := x509.NewCertPool()
		for _, r := range raw[1:] {
			if c, err := x509.ParseCertificate(r); err == nil {
				inter.AddCert(c)
			}
		}
		_, err = leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: serverName})
		return err
	}
	return cfg, nil
}

// httpClient is a client for one BMC: its own transport (so a pin or CA
// never leaks to another BMC) with bounded dial and header waits.
func httpClient(cfg *tls.Config, timeout time.Duration) *http.Client {
	tr := &http.Transport{
		TLSClientConfig:       cfg,
		DialContext:           (&net.Dialer{Timeout: timeout}).DialContext,
		TLSHandshakeTimeout:   timeout,
		ResponseHeaderTimeout: timeout,
		MaxIdleConnsPerHost:   2,
		IdleConnTimeout:       30 * time.Second,
		ForceAttemptHTTP2:     false,
		Proxy:                 nil,
	}
	return &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
		// A redirect could carry the basic-auth header elsewhere.
		return http.ErrUseLastResponse
	}}
}
