package fail_test

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/apierr"
)

// Clients tell a store outage from other Unavailable errors by the reason
// detail, not by the message.
func TestFromTagsDatabaseUnavailable(t *testing.T) {
	for _, tc := range []struct {
		name       string
		err        error
		code       codes.Code
		wantReason string
	}{
		{"store down", fmt.Errorf("list nodes: %w", store.ErrUnavailable), codes.Unavailable, apierr.DatabaseUnavailable},
		{"provider unreachable", fail.Unavailable("qemu is busy"), codes.Unavailable, ""},
		{"not found", fmt.Errorf("node x: %w", store.ErrNotFound), codes.NotFound, ""},
		{"plain", errors.New("boom"), codes.Internal, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := fail.From(tc.err)
			if status.Code(got) != tc.code || apierr.Reason(got) != tc.wantReason {
				t.Fatalf("From(%v) = %v (reason %q), want %v with reason %q", tc.err, got, apierr.Reason(got), tc.code, tc.wantReason)
			}
		})
	}
}
