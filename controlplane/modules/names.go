package modules

import (
	"regexp"

	"github.com/tetherfleet/tether/controlplane/fail"
)

var (
	nameRE    = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,62})$`)
	versionRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._+-]{0,62})$`)
)

// ValidateName checks an object name: lowercase letters, digits, '.', '_'
// and '-', starting with a letter or digit, at most 63 characters.
func ValidateName(field, v string) error {
	if v == "" {
		return fail.Invalid(field, "required")
	}
	if !nameRE.MatchString(v) {
		return fail.Invalid(field, "%q is not a valid name (lowercase letters, digits, '.', '_', '-'; at most 63; starting with a letter or digit)", v)
	}
	return nil
}

// ValidateVersion checks a module version.
func ValidateVersion(field, v string) error {
	if v == "" {
		return fail.Invalid(field, "required")
	}
	if !versionRE.MatchString(v) {
		return fail.Invalid(field, "%q is not a valid version (letters, digits, '.', '_', '+', '-'; at most 63)", v)
	}
	return nil
}
