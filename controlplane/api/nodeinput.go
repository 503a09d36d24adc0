package api

import (
	"fmt"
	"net/netip"
	"unicode/utf8"

	"github.com/tetherfleet/tether/controlplane/api/admin/adminkit"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/modules"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// Bounds on what a node reports. A node's certificate proves who it is,
// not that it is honest: everything it says is stored on its instance row
// and printed on an operator's terminal, so every field is bounded and
// typed here, before anything is stored.
const (
	maxAgentVersion = 128
	maxAgentError   = 4096
	maxBootID       = 64
	maxAddress      = 64 // an IPv6 address with a zone fits
	maxAddresses    = 64
	maxDigests      = 256
	maxTaskError    = 4096
	maxTaskProgress = 1024
)

func validHeartbeat(hb *v1.Heartbeat) error {
	for _, f := range []struct {
		name, v string
		max     int
	}{
		{"heartbeat.agent_version", hb.AgentVersion, maxAgentVersion},
		{"heartbeat.error", hb.Error, maxAgentError},
		{"heartbeat.boot_id", hb.BootId, maxBootID},
	} {
		if err := reportedText(f.name, f.v, f.max); err != nil {
			return err
		}
	}
	if len(hb.RunningModuleDigests) > maxDigests {
		return fail.Invalid("heartbeat.running_module_digests", "%d entries; at most %d", len(hb.RunningModuleDigests), maxDigests)
	}
	for i, d := range hb.RunningModuleDigests {
		field := fmt.Sprintf("heartbeat.running_module_digests[%d]", i)
		if err := reportedText(field, d, len("sha256:")+64); err != nil {
			return err
		}
		if _, err := modules.ParseDigest(d); err != nil {
			return fail.Invalid(field, "%s is not a digest (want sha256:<64 lowercase hex digits>)", quoteSome(d))
		}
	}
	if hb.UptimeSeconds < 0 {
		return fail.Invalid("heartbeat.uptime_seconds", "%d is negative", hb.UptimeSeconds)
	}
	if len(hb.Addresses) > maxAddresses {
		return fail.Invalid("heartbeat.addresses", "%d entries; at most %d", len(hb.Addresses), maxAddresses)
	}
	for i, a := range hb.Addresses {
		field := fmt.Sprintf("heartbeat.addresses[%d]", i)
		if err := reportedText(field, a, maxAddress); err != nil {
			return err
		}
		if _, err := netip.ParseAddr(a); err != nil {
			return fail.Invalid(field, "%s is not an IP address", quoteSome(a))
		}
	}
	return nil
}

// validTaskUpdate bounds the free text of a task update. Output is a
// command's own bytes, capped by the task service and shown only on
// request, so it may hold anything.
func validTaskUpdate(u *v1.TaskUpdate) error {
	if err := reportedText("task_update.error_message", u.ErrorMessage, maxTaskError); err != nil {
		return err
	}
	return reportedText("task_update.progress", u.Progress, maxTaskProgress)
}

// reportedText refuses a string a node reported that is longer than max
// bytes or holds a control character: ESC and OSC sequences would act on
// an operator's terminal, and a line break would forge a row of a table.
func reportedText(field, s string, max int) error {
	if len(s) > max {
		return fail.Invalid(field, "%d bytes; at most %d", len(s), max)
	}
	for i, r := range s {
		if isControl(r) {
			return fail.Invalid(field, "control character %U at byte %d", r, i)
		}
		if r == utf8.RuneError {
			return fail.Invalid(field, "not valid UTF-8 at byte %d", i)
		}
	}
	return nil
}

// isControl reports whether r is a character a terminal acts on rather
// than prints: C0 (line breaks and ESC among them), DEL, C1, and the
// Unicode line and paragraph separators.
func isControl(r rune) bool {
	return r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f) || r == 0x2028 || r == 0x2029
}

// quoteSome is adminkit.QuoteSome.
func quoteSome(s string) string { return adminkit.QuoteSome(s) }
