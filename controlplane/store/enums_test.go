package store_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/controlplane/store"
)

// TestParseEnums: every value of each enumeration parses to itself and
// prints as it is stored; anything else is refused with an error that
// names the value and wraps ErrUnknownValue.
func TestParseEnums(t *testing.T) {
	type tc struct {
		in      string
		want    string // String() of the parsed value; "" when refused
		wantErr string
	}
	tests := []struct {
		enum  string
		parse func(string) (string, error)
		cases []tc
	}{
		{"task status", wrap(store.ParseTaskStatus), []tc{
			{"pending", "pending", ""}, {"leased", "leased", ""}, {"running", "running", ""},
			{"succeeded", "succeeded", ""}, {"failed", "failed", ""}, {"cancelled", "cancelled", ""},
			{"", "", `task status ""`}, {"Pending", "", `task status "Pending"`}, {"done", "", `task status "done"`},
		}},
		{"task target", wrap(store.ParseTaskTarget), []tc{
			{"agent", "agent", ""}, {"worker", "worker", ""},
			{"", "", `task target ""`}, {"node", "", `task target "node"`},
		}},
		{"task kind", wrap(store.ParseTaskKind), []tc{
			{"exec", "exec", ""}, {"reboot", "reboot", ""}, {"poweroff", "poweroff", ""}, {"module_sync", "module_sync", ""},
			{"renew_certificate", "renew_certificate", ""}, {"provision", "provision", ""}, {"start", "start", ""},
			{"stop", "stop", ""}, {"terminate", "terminate", ""},
			{"", "", `task kind ""`}, {"shell", "", `task kind "shell"`}, {"module-sync", "", `task kind "module-sync"`},
		}},
		{"certificate kind", wrap(store.ParseCertKind), []tc{
			{"node", "node", ""}, {"admin", "admin", ""}, {"server", "server", ""},
			{"instance", "", `certificate kind "instance"`}, {"", "", `certificate kind ""`},
		}},
		{"role", wrap(store.ParseRole), []tc{
			{"viewer", "viewer", ""}, {"operator", "operator", ""}, {"admin", "admin", ""},
			{"root", "", `role "root"`}, {"Admin", "", `role "Admin"`}, {"", "", `role ""`},
		}},
		{"severity", func(s string) (string, error) {
			v, err := store.ParseSeverity(s)
			return v.String(), err
		}, []tc{
			{"low", "low", ""}, {"medium", "medium", ""}, {"high", "high", ""}, {"critical", "critical", ""},
			{"3", "", `severity "3"`}, {"HIGH", "", `severity "HIGH"`}, {"", "", `severity ""`},
		}},
	}
	for _, tt := range tests {
		for _, c := range tt.cases {
			t.Run(tt.enum+"/"+c.in, func(t *testing.T) {
				got, err := tt.parse(c.in)
				if c.wantErr != "" {
					if err == nil || !errors.Is(err, store.ErrUnknownValue) || !strings.Contains(err.Error(), c.wantErr) {
						t.Fatalf("parse %q = %q, %v; want an ErrUnknownValue naming %s", c.in, got, err, c.wantErr)
					}
					return
				}
				if err != nil || got != c.want {
					t.Fatalf("parse %q = %q, %v; want %q", c.in, got, err, c.want)
				}
			})
		}
	}
}

func wrap[T interface {
	~string
	String() string
}](parse func(string) (T, error)) func(string) (string, error) {
	return func(s string) (string, error) {
		v, err := parse(s)
		if err != nil {
			return "", err
		}
		return v.String(), nil
	}
}

func TestTaskStatusTerminal(t *testing.T) {
	for _, s := range store.TaskStatuses() {
		want := s == store.TaskSucceeded || s == store.TaskFailed || s == store.TaskCancelled
		if got := s.Terminal(); got != want {
			t.Errorf("%s.Terminal() = %v, want %v", s, got, want)
		}
		if got := (&store.Task{Status: s}).Terminal(); got != want {
			t.Errorf("Task{Status: %s}.Terminal() = %v, want %v", s, got, want)
		}
	}
}

func TestRoleAtLeast(t *testing.T) {
	tests := []struct {
		have, need store.Role
		want       bool
	}{
		{store.RoleViewer, store.RoleViewer, true},
		{store.RoleViewer, store.RoleOperator, false},
		{store.RoleViewer, store.RoleAdmin, false},
		{store.RoleOperator, store.RoleViewer, true},
		{store.RoleOperator, store.RoleAdmin, false},
		{store.RoleAdmin, store.RoleViewer, true},
		{store.RoleAdmin, store.RoleOperator, true},
		{store.RoleAdmin, store.RoleAdmin, true},
		// A role outside the list may do nothing, and nothing needs one.
		{"root", store.RoleViewer, false},
		{"", store.RoleViewer, false},
		{store.RoleAdmin, "root", false},
	}
	for _, tc := range tests {
		if got := tc.have.AtLeast(tc.need); got != tc.want {
			t.Errorf("%q.AtLeast(%q) = %v, want %v", tc.have, tc.need, got, tc.want)
		}
	}
}

func TestSeverityOrderAndNames(t *testing.T) {
	tests := []struct {
		sev   store.Severity
		name  string
		valid bool
	}{
		{0, "severity(0)", false},
		{store.SeverityLow, "low", true},
		{store.SeverityMedium, "medium", true},
		{store.SeverityHigh, "high", true},
		{store.SeverityCritical, "critical", true},
		{5, "severity(5)", false},
	}
	for i, tc := range tests {
		if got := tc.sev.String(); got != tc.name {
			t.Errorf("Severity(%d).String() = %q, want %q", int(tc.sev), got, tc.name)
		}
		if got := tc.sev.Valid(); got != tc.valid {
			t.Errorf("Severity(%d).Valid() = %v, want %v", int(tc.sev), got, tc.valid)
		}
		// Min-severity filters compare the stored numbers: the order is the contract.
		if i > 0 && tests[i-1].sev >= tc.sev {
			t.Errorf("severity %s does not rank above %s", tc.name, tests[i-1].name)
		}
	}
}
