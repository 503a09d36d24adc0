package tasks

import (
	"errors"
	"strings"
	"testing"
)

// SystemdPower asks systemd, without waiting for the shutdown it starts
// (which stops the agent), and says what failed when systemctl does.
func TestSystemdPower(t *testing.T) {
	for _, tc := range []struct {
		name    string
		act     func(SystemdPower) error
		want    string
		failure error
		err     string
	}{
		{"poweroff", SystemdPower.PowerOff, "systemctl --no-block poweroff", nil, ""},
		{"reboot", SystemdPower.Reboot, "systemctl --no-block reboot", nil, ""},
		{"systemctl fails", SystemdPower.PowerOff, "systemctl --no-block poweroff", errors.New("Failed to connect to bus"), "ask systemd to poweroff: Failed to connect to bus"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got string
			p := SystemdPower{Run: func(name string, args ...string) error {
				got = strings.Join(append([]string{name}, args...), " ")
				return tc.failure
			}}
			err := tc.act(p)
			if got != tc.want {
				t.Fatalf("ran %q, want %q", got, tc.want)
			}
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || err.Error() != tc.err) {
				t.Fatalf("err = %v, want %q", err, tc.err)
			}
		})
	}
}
