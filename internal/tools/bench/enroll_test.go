package bench

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestResultCheck(t *testing.T) {
	limited := status.Error(codes.ResourceExhausted, "too many requests from 127.0.0.1")
	tests := []struct {
		name string
		r    Result
		want []string // substrings of the error; nil: no error
	}{
		{"all through", Result{N: 2000}, nil},
		{"one percent may fail", Result{N: 2000, Errors: 20, FirstError: limited}, nil},
		{"rate-limited", Result{N: 2000, Errors: 1800, FirstError: limited},
			[]string{"1800 of 2000", "--unauthenticated-rate=-1", "--max-unauthenticated-per-source=-1", "bench-peers"}},
		{"another cause", Result{N: 100, Errors: 50, FirstError: errors.New("connection refused")},
			[]string{"50 of 100", "connection refused"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.r.Check()
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Check = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Check passed a run whose figures mean nothing")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Check = %q, want it to say %q", err, w)
				}
			}
			if tc.r.FirstError != limited && strings.Contains(err.Error(), "unauthenticated-rate") {
				t.Errorf("Check blamed the rate limit for %v", tc.r.FirstError)
			}
		})
	}
}
