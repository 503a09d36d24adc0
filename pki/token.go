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

// tokenBytes is 256 bits of randomness (SPEC 3).
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
	if len(token) == 0 || len(token) > MaxTokenLength || !strings.HasPrefix(token, TokenPrefix) {
		return "", errMalformedToken
	}
	raw, err := base64.RawURLEncoding.DecodeString(token[len(TokenPrefix):])
	if err != nil || len(raw) != tokenBytes {
		return "", errMalformedToken
	}
	return HashToken(token), nil
}

// HashToken is the stored form of a token: hex SHA-256 of its text.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}
