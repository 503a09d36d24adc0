// Package protoconv converts the domain's enumerations (controlplane/store)
// to and from their proto enums: one pair of functions per enumeration, so
// that every handler and every resource package answers with the same
// value and refuses the same input. A proto value's stored name is its
// enum name without the prefix, in lower case (TASK_STATUS_PENDING is
// "pending"); UNSPECIFIED is the zero value, which filters read as "any".
package protoconv

import (
	"fmt"
	"strings"

	"github.com/tetherfleet/tether/controlplane/store"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// protoEnum is a generated enum whose values are PREFIX_NAME and whose zero
// value is PREFIX_UNSPECIFIED.
type protoEnum interface {
	~int32
	String() string
}

// storedName is how an enum value is stored: TASK_STATUS_PENDING is
// "pending", UNSPECIFIED is "".
func storedName[E protoEnum](prefix string, e E) string {
	if e == 0 {
		return ""
	}
	return strings.ToLower(strings.TrimPrefix(e.String(), prefix))
}

// fromStored is the enum value of a stored name (UNSPECIFIED if unknown).
func fromStored[E protoEnum](prefix, name string, values map[string]int32) E {
	return E(values[prefix+strings.ToUpper(name)])
}

// parse converts a proto value through its domain Parse; UNSPECIFIED is
// the zero value and no error.
func parse[E protoEnum, T ~string](prefix string, e E, parse func(string) (T, error)) (T, error) {
	if e == 0 {
		return "", nil
	}
	return parse(storedName(prefix, e))
}

// TaskStatus is the proto form of a task status.
func TaskStatus(s store.TaskStatus) v1.TaskStatus {
	return fromStored[v1.TaskStatus]("TASK_STATUS_", string(s), v1.TaskStatus_value)
}

// TaskStatusFrom is the domain form of a proto task status.
func TaskStatusFrom(s v1.TaskStatus) (store.TaskStatus, error) {
	return parse("TASK_STATUS_", s, store.ParseTaskStatus)
}

// TaskTarget is the proto form of a task target.
func TaskTarget(t store.TaskTarget) v1.TaskTarget {
	return fromStored[v1.TaskTarget]("TASK_TARGET_", string(t), v1.TaskTarget_value)
}

// TaskTargetFrom is the domain form of a proto task target.
func TaskTargetFrom(t v1.TaskTarget) (store.TaskTarget, error) {
	return parse("TASK_TARGET_", t, store.ParseTaskTarget)
}

// TaskKind is the proto form of a task kind (UNSPECIFIED for a kind the
// API does not name).
func TaskKind(k store.TaskKind) v1.TaskKind {
	return fromStored[v1.TaskKind]("TASK_KIND_", string(k), v1.TaskKind_value)
}

// TaskKindFrom is the domain form of a proto task kind.
func TaskKindFrom(k v1.TaskKind) (store.TaskKind, error) {
	return parse("TASK_KIND_", k, store.ParseTaskKind)
}

// CertKind is the proto form of a certificate kind. A kind other than
// admin or server is reported as a node's, as it always was.
func CertKind(k store.CertKind) v1.CertificateKind {
	switch k {
	case store.CertKindAdmin:
		return v1.CertificateKind_CERTIFICATE_KIND_ADMIN
	case store.CertKindServer:
		return v1.CertificateKind_CERTIFICATE_KIND_SERVER
	}
	return v1.CertificateKind_CERTIFICATE_KIND_NODE
}

// CertKindFrom is the domain form of a proto certificate kind.
func CertKindFrom(k v1.CertificateKind) (store.CertKind, error) {
	return parse("CERTIFICATE_KIND_", k, store.ParseCertKind)
}

// Severity is the proto form of a severity: the same numbers.
func Severity(s store.Severity) v1.Severity { return v1.Severity(s) }

// SeverityFrom is the domain form of a proto severity; UNSPECIFIED is 0,
// which a minimum-severity filter reads as "any".
func SeverityFrom(s v1.Severity) (store.Severity, error) {
	if s == 0 {
		return 0, nil
	}
	sev := store.Severity(s)
	if !sev.Valid() {
		return 0, fmt.Errorf("%w: severity %d (want 1 to 4, low to critical)", store.ErrUnknownValue, int32(s))
	}
	return sev, nil
}
