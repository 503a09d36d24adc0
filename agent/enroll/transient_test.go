package enroll_test

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/agent/enroll"
)

// The agent and the fleet simulator retry exactly these.
func TestTransient(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"unavailable", status.Error(codes.Unavailable, "connection refused"), true},
		{"deadline", status.Error(codes.DeadlineExceeded, "slow"), true},
		{"rate limited", status.Error(codes.ResourceExhausted, "per-source limit"), true},
		{"aborted", status.Error(codes.Aborted, "retry"), true},
		{"wrapped unavailable", fmt.Errorf("enroll: %w", status.Error(codes.Unavailable, "x")), true},
		{"token refused", status.Error(codes.PermissionDenied, "token spent"), false},
		{"bad request", status.Error(codes.InvalidArgument, "csr"), false},
		{"pin mismatch", fmt.Errorf("dial: %w", &enroll.PinMismatchError{Server: "s", Expected: "sha256:a"}), false},
		{"plain error", errors.New("disk full"), false},
	} {
		if got := enroll.Transient(tc.err); got != tc.want {
			t.Errorf("%s: Transient(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
