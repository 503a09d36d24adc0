package identity

import (
	"fmt"
	"strings"

	"github.com/tetherfleet/tether/pki"
)

// Fields is the enrollment material: where the control plane is, the
// one-time token, and the pinned CA fingerprint. Any of them may be empty
// when a source holds only part of it.
type Fields struct {
	URL   string // https://HOST:PORT[,https://HOST:PORT...], normalised by CheckURL
	Token string
	CA    string // "sha256:<hex>", normalised by pki.ParseFingerprint
	// Instance is the instance a tokenless node boots as: public, since a
	// TPM attestation, not the id, proves it (docs/adr/0023).
	Instance string
}

// complete is true once the material for one way of enrolling is known:
// a token, or the instance id a TPM proves.
func (f Fields) complete() bool {
	return f.URL != "" && f.CA != "" && (f.Token != "" || f.Instance != "")
}

// CheckInstance checks an instance id's shape: printable, no blanks, and
// not longer than an id, so that a mangled hand-off is named where it was
// found.
func CheckInstance(s string) (string, error) {
	if len(s) > 64 {
		return "", fmt.Errorf("instance id of %d bytes is longer than any instance id", len(s))
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return "", fmt.Errorf("instance id %q has a character %q no instance id has", s, r)
		}
	}
	return s, nil
}

// CheckToken checks a bootstrap token's shape, so a token mangled in
// transit (a cut-off command line, a stray quote) is reported where it was
// found rather than as an enrollment refusal later.
func CheckToken(s string) (string, error) {
	if _, err := pki.ParseToken(s); err != nil {
		// Enough of the value to recognise it by (a stray quote, another
		// parameter's value), never all of it: a mangled token may still be
		// most of a real one. A short value used to be shown whole.
		shown := s[:min(8, len(s)/2)] + "..."
		return "", fmt.Errorf("%q (%d bytes) is not a Tether bootstrap token (want %s followed by 43 base64url characters)", shown, len(s), pki.TokenPrefix)
	}
	return s, nil
}

// CheckCA normalises a CA fingerprint.
func CheckCA(s string) (string, error) {
	fp, err := pki.ParseFingerprint(s)
	if err != nil {
		return "", fmt.Errorf("%w (compute it with: openssl x509 -in ca.crt -outform der | sha256sum)", err)
	}
	return fp, nil
}

// check validates every non-empty field, naming where it came from.
func (f Fields) check(where func(field string) string) (Fields, error) {
	var err error
	if f.URL != "" {
		if f.URL, err = CheckURL(f.URL); err != nil {
			return Fields{}, fmt.Errorf("%s: %w", where("url"), err)
		}
	}
	if f.Token != "" {
		if f.Token, err = CheckToken(f.Token); err != nil {
			return Fields{}, fmt.Errorf("%s: %w", where("token"), err)
		}
	}
	if f.CA != "" {
		if f.CA, err = CheckCA(f.CA); err != nil {
			return Fields{}, fmt.Errorf("%s: %w", where("ca"), err)
		}
	}
	if f.Instance != "" {
		if f.Instance, err = CheckInstance(f.Instance); err != nil {
			return Fields{}, fmt.Errorf("%s: %w", where("instance"), err)
		}
	}
	return f, nil
}

// String never prints the token: it is a secret until it is spent.
func (f Fields) String() string {
	tok := ""
	if f.Token != "" {
		tok = "(set)"
	}
	return fmt.Sprintf("url=%s token=%s ca=%s instance=%s", f.URL, tok, f.CA, f.Instance)
}

func trimValue(b []byte) string { return strings.TrimRight(string(b), " \t\r\n\x00") }
