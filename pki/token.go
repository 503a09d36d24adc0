package pki

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// TokenPrefix marks Tether bootstrap tokens so they are recognisable in a
// leaked-secret scan and cannot be confused with other strings.
const TokenPrefix = "tbt_"

// tokenBytes is 256 bits of randomness (docs/design.md §3.1).
const tokenBytes = 32

// MaxTokenLength bounds what ParseToken will look at.
const MaxTokenLength = 128

var errMalformedToken = errors.New("malformed bootstrap token")

// NewToken returns a fresh bootstrap token and the hash to store. The token
// itself is shown once and never stored.
func NewToken() (token, hash string, err error) {
	b := make([]byte, tokenBytes)
	if _, err := rand.Read(b); err != nil {
		return "", "", fmt.Errorf("generate token: %w", err)
	}
	token = TokenPrefix + base64.RawURLEncoding.EncodeToString(b)
	return token, HashToken(token), nil
}

// ParseToken checks a presented token's shape and returns its hash. Shape
// errors are reported without detail so callers cannot probe the format of
// stored tokens; the caller answers Unauthenticated either way.
func ParseToken(token string) (hash string, err error) {
	body, ok := strings.CutPrefix(token, TokenPrefix)
	if !ok || len(body) != base64.RawURLEncoding.EncodedLen(tokenBytes) {
		return "", errMalformedToken
	}
	// The decoder skips \r and \n, so check the alphabet first: a token is
	// exactly the text NewToken makes, nothing that merely decodes the same.
	for i := 0; i < len(body); i++ {
		if !isBase64URL(body[i]) {
			return "", errMalformedToken
		}
	}
	if raw, err := base64.RawURLEncoding.DecodeString(body); err != nil || len(raw) != tokenBytes {
		return "", errMalformedToken
	}
	return HashToken(token), nil
}

// HashToken is the stored form of a token: hex SHA-256 of its text.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

func isBase64URL(c byte) bool {
	return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}
