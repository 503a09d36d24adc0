// Package tasks runs the work the control plane leases to an agent: exec
// (a command with a timeout and capped output), reboot and poweroff
// (behind Power, so a test or a --root-mode=none run never touches its
// host), module_sync and renew_certificate.
package tasks

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tetherfleet/tether/agent/session"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// DefaultExecTimeout applies when a task gives none (docs/design.md §6.4).
const DefaultExecTimeout = 300 * time.Second

// Executor implements session.Runner.
type Executor struct {
	Power Power
	// Sync re-fetches the assignment and verifies every module; the report
	// becomes the task's output (drift included).
	Sync func(ctx context.Context) (report string, err error)
	// Renew forces a certificate renewal and describes the result.
	Renew func(ctx context.Context) (string, error)
	// Procs, when set, tracks the processes exec starts (PID 1 reaps every
	// other child it inherits).
	Procs *Registry
	Logf  func(format string, args ...any)
	// After waits for the exec timeout; default time.After.
	After func(time.Duration) <-chan time.Time
	// KillWait bounds the wait for output after a kill (default 2 s).
	KillWait time.Duration
}

var _ session.Runner = (*Executor)(nil)

// Run executes one task.
func (e *Executor) Run(ctx context.Context, a *tetherv1.TaskAssignment, s session.Settings) session.Outcome {
	switch a.GetKind() {
	case tetherv1.TaskKind_TASK_KIND_EXEC:
		return e.exec(ctx, a.GetExec(), s.MaxTaskOutputBytes)
	case tetherv1.TaskKind_TASK_KIND_REBOOT:
		return e.power(ctx, "reboot")
	case tetherv1.TaskKind_TASK_KIND_POWEROFF:
		return e.power(ctx, "poweroff")
	case tetherv1.TaskKind_TASK_KIND_MODULE_SYNC:
		return e.text(ctx, "module_sync", e.Sync)
	case tetherv1.TaskKind_TASK_KIND_RENEW_CERTIFICATE:
		return e.text(ctx, "renew_certificate", e.Renew)
	default:
		return session.Outcome{Err: fmt.Errorf("task kind %v is not one this agent runs (agent kinds: exec, reboot, poweroff, module_sync, renew_certificate)", a.GetKind())}
	}
}

func (e *Executor) logf(format string, args ...any) {
	if e.Logf != nil {
		e.Logf(format, args...)
	}
}

func (e *Executor) text(ctx context.Context, kind string, fn func(context.Context) (string, error)) session.Outcome {
	if fn == nil {
		return session.Outcome{Err: fmt.Errorf("%s is not available in this agent", kind)}
	}
	out, err := fn(ctx)
	res := &tetherv1.TaskResult{Output: []byte(out)}
	if err != nil {
		res.ExitCode = 1
	}
	return session.Outcome{Result: res, Err: err}
}

// power reports success first and acts once the report is out: a reboot
// that happened before its task was reported would be leased again to the
// next boot, and reboot that one too.
func (e *Executor) power(_ context.Context, kind string) session.Outcome {
	if e.Power == nil {
		return session.Outcome{Err: errors.New(kind + ": no power control configured")}
	}
	if err := e.Power.Check(); err != nil {
		return session.Outcome{Err: fmt.Errorf("%s: %w", kind, err)}
	}
	act := e.Power.Reboot
	if kind == "poweroff" {
		act = e.Power.PowerOff
	}
	return session.Outcome{
		Result: &tetherv1.TaskResult{Output: []byte(e.Power.Describe(kind) + "\n")},
		Then: func() {
			if err := act(); err != nil {
				e.logf("%s failed after it was reported: %v", kind, err)
			}
		},
	}
}

// capWriter keeps the first max bytes written and counts the rest.
type capWriter struct {
	max       int
	buf       []byte
	truncated bool
}

func (w *capWriter) Write(p []byte) (int, error) {
	if room := w.max - len(w.buf); room > 0 {
		w.buf = append(w.buf, p[:min(room, len(p))]...)
		if len(p) > room {
			w.truncated = true
		}
	} else if len(p) > 0 {
		w.truncated = true
	}
	// Always claim the whole write: the command must not see EPIPE
	// because its output is being capped.
	return len(p), nil
}

func quoteArgv(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		if a == "" || strings.ContainsAny(a, " \t\n'\"\\$") {
			q[i] = fmt.Sprintf("%q", a)
		} else {
			q[i] = a
		}
	}
	return strings.Join(q, " ")
}
