package credentials

import (
	"context"
	"errors"
	"unicode"
	"unicode/utf8"

	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/clock"
)

// Bounds on what a credential holds.
const (
	MaxUsername = 256
	MaxPassword = 1024
)

// Service writes and reads credentials.
type Service struct {
	Store  store.Store
	Clock  clock.Clock
	Sealer *Sealer
}

// Validate checks a credential's user name and password.
func Validate(username string, password []byte) error {
	switch {
	case username == "":
		return fail.Invalid("username", "required")
	case len(username) > MaxUsername || !utf8.ValidString(username) || hasControl(username):
		return fail.Invalid("username", "at most %d printable UTF-8 bytes", MaxUsername)
	case len(password) == 0:
		return fail.Invalid("password", "required")
	case len(password) > MaxPassword:
		return fail.Invalid("password", "longer than %d bytes", MaxPassword)
	}
	return nil
}

func hasControl(s string) bool {
	for _, r := range s {
		if unicode.IsControl(r) {
			return true
		}
	}
	return false
}

// Create seals password and stores the credential. name is validated by
// the caller (the API's name rule).
func (s *Service) Create(ctx context.Context, name, username string, password []byte) (*store.Credential, error) {
	if err := Validate(username, password); err != nil {
		return nil, err
	}
	sealed, err := s.Sealer.Seal(name, password)
	if err != nil {
		return nil, err
	}
	now := s.Clock.Now()
	c := &store.Credential{Name: name, Username: username, Sealed: sealed, CreatedAt: now, UpdatedAt: now}
	err = s.Store.Tx(ctx, func(q store.Queries) error { return q.CreateCredential(ctx, c) })
	if errors.Is(err, store.ErrAlreadyExists) {
		return nil, fail.Exists("credential %q already exists", name)
	}
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Update reseals a credential's password, and replaces its user name
// when username is not empty.
func (s *Service) Update(ctx context.Context, name, username string, password []byte) (*store.Credential, error) {
	var c *store.Credential
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		var err error
		if c, err = q.GetCredential(ctx, name); err != nil {
			return err
		}
		if username != "" {
			c.Username = username
		}
		if err := Validate(c.Username, password); err != nil {
			return err
		}
		if c.Sealed, err = s.Sealer.Seal(name, password); err != nil {
			return err
		}
		c.UpdatedAt = s.Clock.Now()
		return q.UpdateCredential(ctx, c)
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// List lists credentials. Their sealed passwords are the caller's to drop.
func (s *Service) List(ctx context.Context) ([]*store.Credential, error) {
	return s.Store.ListCredentials(ctx)
}

// Delete removes a credential no node uses.
func (s *Service) Delete(ctx context.Context, name string) error {
	return s.Store.Tx(ctx, func(q store.Queries) error { return q.DeleteCredential(ctx, name) })
}

// Open returns a credential's user name and password, for the control
// plane's own use (driving a BMC); never for an API answer.
func (s *Service) Open(ctx context.Context, q store.CredentialQueries, name string) (username, password string, err error) {
	c, err := q.GetCredential(ctx, name)
	if err != nil {
		return "", "", err
	}
	pw, err := s.Sealer.Open(name, c.Sealed)
	if err != nil {
		return "", "", err
	}
	return c.Username, string(pw), nil
}
