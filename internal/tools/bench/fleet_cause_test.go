package bench

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A storm's failures are sorted by where they happened and what the
// transport said, so a report can say why reconnections were lost.
func TestFailureCause(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("agent a: %w", status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:1: connect: connection refused"`)), "attempt: connection refused"},
		{fmt.Errorf("agent a: %w: %w", errLost, status.Error(codes.Unavailable, "error reading from server: EOF")), "stream lost: EOF"},
		{fmt.Errorf("agent a: %w", status.Error(codes.Unavailable, "connection error: desc = \"error reading server preface: read tcp: use of closed network connection\"")), "attempt: no HTTP/2 preface from the server"},
		{fmt.Errorf("agent a: %w", status.Error(codes.Unavailable, "connection error: desc = \"transport: authentication handshake failed: read: connection reset by peer\"")), "attempt: connection reset"},
		{fmt.Errorf("agent a: %w", status.Error(codes.FailedPrecondition, "instance i is terminated")), "attempt: FailedPrecondition"},
		{errors.New("something odd"), "attempt: other"},
	} {
		if got := FailureCause(tc.err); got != tc.want {
			t.Errorf("FailureCause(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
