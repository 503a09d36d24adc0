package apierr_test

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/internal/apierr"
)

func TestReason(t *testing.T) {
	tagged := apierr.New(codes.Unavailable, apierr.DatabaseUnavailable, "store down")
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"tagged", tagged, apierr.DatabaseUnavailable},
		{"wrapped", fmt.Errorf("list nodes: %w", tagged), apierr.DatabaseUnavailable},
		{"same words, no detail", status.Error(codes.Unavailable, "the database is unavailable"), ""},
		{"not a status", errors.New("database is unavailable"), ""},
		{"nil", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := apierr.Reason(tc.err); got != tc.want {
				t.Fatalf("Reason = %q, want %q", got, tc.want)
			}
		})
	}
	if status.Code(tagged) != codes.Unavailable || status.Convert(tagged).Message() != "store down" {
		t.Fatalf("code/message changed: %v", tagged)
	}
}
