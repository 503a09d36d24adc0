package store

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// The domain's enumerations beside the records that carry them. Each is a
// named type with String and a Parse that refuses a value outside its list
// (docs/adr/0050); their proto forms are converted in one place
// (controlplane/api/protoconv). Task statuses and targets are closed sets
// the backends check on the way in and out, as they do the lifecycle's
// states. Task kinds, certificate kinds, roles, severities and event kinds
// are stored as given: the worker fails a task of a kind it has no handler
// for, and a row written by a newer replica of a mixed-version fleet must
// still read.

// ErrUnknownValue marks a value outside an enumeration; callers test for
// it with errors.Is and report it as bad input.
var ErrUnknownValue = errors.New("unknown value")

// parseEnum returns s as a T if it is one of all.
func parseEnum[T ~string](what string, all []T, s string) (T, error) {
	if slices.Contains(all, T(s)) {
		return T(s), nil
	}
	return "", fmt.Errorf("%w: %s %q (want one of %s)", ErrUnknownValue, what, s, joinEnum(all))
}

func joinEnum[T ~string](all []T) string {
	names := make([]string, len(all))
	for i, v := range all {
		names[i] = string(v)
	}
	return strings.Join(names, ", ")
}

// TaskStatus is where a task is in its life (docs/design.md §6).
type TaskStatus string

// Task statuses as stored.
const (
	TaskPending   TaskStatus = "pending"
	TaskLeased    TaskStatus = "leased"
	TaskRunning   TaskStatus = "running"
	TaskSucceeded TaskStatus = "succeeded"
	TaskFailed    TaskStatus = "failed"
	TaskCancelled TaskStatus = "cancelled"
)

var taskStatuses = []TaskStatus{TaskPending, TaskLeased, TaskRunning, TaskSucceeded, TaskFailed, TaskCancelled}

// TaskStatuses returns every task status, in life order.
func TaskStatuses() []TaskStatus { return slices.Clone(taskStatuses) }

func (s TaskStatus) String() string { return string(s) }

// Terminal reports whether a task in s has ended.
func (s TaskStatus) Terminal() bool {
	return s == TaskSucceeded || s == TaskFailed || s == TaskCancelled
}

// ParseTaskStatus converts stored or user text into a TaskStatus.
func ParseTaskStatus(s string) (TaskStatus, error) { return parseEnum("task status", taskStatuses, s) }

// TaskTarget is who runs a task: the instance's agent or a control-plane
// worker.
type TaskTarget string

// Task targets as stored.
const (
	TaskTargetAgent  TaskTarget = "agent"
	TaskTargetWorker TaskTarget = "worker"
)

var taskTargets = []TaskTarget{TaskTargetAgent, TaskTargetWorker}

func (t TaskTarget) String() string { return string(t) }

// ParseTaskTarget converts stored or user text into a TaskTarget.
func ParseTaskTarget(s string) (TaskTarget, error) { return parseEnum("task target", taskTargets, s) }

// TaskKind is what a task does. Agent kinds are run by the instance's
// agent; worker kinds are provider work the control plane runs itself
// (docs/design.md §6.1). Reboot is both: its target says who.
type TaskKind string

// Task kinds as stored.
const (
	TaskKindExec             TaskKind = "exec"
	TaskKindReboot           TaskKind = "reboot"
	TaskKindPoweroff         TaskKind = "poweroff"
	TaskKindModuleSync       TaskKind = "module_sync"
	TaskKindRenewCertificate TaskKind = "renew_certificate"

	TaskKindProvision TaskKind = "provision"
	TaskKindStart     TaskKind = "start"
	TaskKindStop      TaskKind = "stop"
	TaskKindTerminate TaskKind = "terminate"
)

var taskKinds = []TaskKind{TaskKindExec, TaskKindReboot, TaskKindPoweroff, TaskKindModuleSync, TaskKindRenewCertificate,
	TaskKindProvision, TaskKindStart, TaskKindStop, TaskKindTerminate}

func (k TaskKind) String() string { return string(k) }

// ParseTaskKind converts stored or user text into a TaskKind.
func ParseTaskKind(s string) (TaskKind, error) { return parseEnum("task kind", taskKinds, s) }

// CertKind is whom a certificate identifies.
type CertKind string

// Certificate kinds as stored.
const (
	CertKindNode   CertKind = "node"
	CertKindAdmin  CertKind = "admin"
	CertKindServer CertKind = "server"
)

var certKinds = []CertKind{CertKindNode, CertKindAdmin, CertKindServer}

func (k CertKind) String() string { return string(k) }

// ParseCertKind converts stored or user text into a CertKind.
func ParseCertKind(s string) (CertKind, error) { return parseEnum("certificate kind", certKinds, s) }

// Role is an admin identity's authority; the role is in the admin
// certificate (pki.Identity carries it as text).
type Role string

// Roles, weakest first.
const (
	RoleViewer   Role = "viewer"
	RoleOperator Role = "operator"
	RoleAdmin    Role = "admin"
)

var roles = []Role{RoleViewer, RoleOperator, RoleAdmin}

func (r Role) String() string { return string(r) }

// AtLeast reports whether r may do what need may. A role outside the list
// may do nothing, and nothing needs one.
func (r Role) AtLeast(need Role) bool {
	have, want := slices.Index(roles, r), slices.Index(roles, need)
	return have >= 0 && want >= 0 && have >= want
}

// ParseRole converts stored or user text into a Role.
func ParseRole(s string) (Role, error) { return parseEnum("role", roles, s) }

// Severity is how much an event matters. The order matters for
// min-severity filters, so it is stored as its number.
type Severity int

// Severities as stored. Zero is unset: an event written without one is low.
const (
	SeverityLow      Severity = 1
	SeverityMedium   Severity = 2
	SeverityHigh     Severity = 3
	SeverityCritical Severity = 4
)

var severityNames = map[Severity]string{SeverityLow: "low", SeverityMedium: "medium", SeverityHigh: "high", SeverityCritical: "critical"}

// String is the severity's name ("high"), or its number when it has none.
func (s Severity) String() string {
	if n, ok := severityNames[s]; ok {
		return n
	}
	return fmt.Sprintf("severity(%d)", int(s))
}

// Valid reports whether s is one of the four severities.
func (s Severity) Valid() bool {
	_, ok := severityNames[s]
	return ok
}

// ParseSeverity converts a severity's name ("high") into a Severity.
func ParseSeverity(s string) (Severity, error) {
	for sev, n := range severityNames {
		if n == s {
			return sev, nil
		}
	}
	return 0, fmt.Errorf("%w: severity %q (want one of low, medium, high, critical)", ErrUnknownValue, s)
}

// EventKind names what an event records ("instance.silent"). The
// vocabulary is controlplane/events', which writes them and parses them
// (events.ParseKind); the store keeps whatever kind it is given, since the
// event log outlives any one version's vocabulary.
type EventKind string

func (k EventKind) String() string { return string(k) }
