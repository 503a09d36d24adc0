package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
)

type ctxOnlyStream struct{ grpc.ServerStream }

func (ctxOnlyStream) Context() context.Context { return context.Background() }

// An internal error reaches the client as an id only; its text is logged
// at Error under that id. Every other code passes through unchanged.
func TestInternalErrorsAreLoggedWithAnIDAndHidden(t *testing.T) {
	secret := "open /var/lib/tether/blobs/sha256/ab: permission denied"
	tests := []struct {
		name     string
		err      error
		code     codes.Code
		hidden   bool
		wantText string
	}{
		{"plain error", fmt.Errorf("read module: %s", secret), codes.Internal, true, ""},
		{"fail.Internal", fail.Internal("module is recorded but its blob is missing: %s", secret), codes.Internal, true, ""},
		{"unknown status", status.Error(codes.Unknown, secret), codes.Internal, true, ""},
		{"not found", fmt.Errorf("instance x: %w", store.ErrNotFound), codes.NotFound, false, "instance x not found"},
		{"invalid", fail.Invalid("name", "required"), codes.InvalidArgument, false, "name: required"},
	}
	idRE := regexp.MustCompile(`^internal error \(id ([0-9a-f]{12})\)`)
	for _, tc := range tests {
		for _, kind := range []string{"unary", "stream"} {
			t.Run(tc.name+"/"+kind, func(t *testing.T) {
				var logs bytes.Buffer
				unary, stream := mapErrors(slog.New(slog.NewTextHandler(&logs, nil)), nil)
				var err error
				if kind == "unary" {
					_, err = unary(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/t/M"},
						func(context.Context, any) (any, error) { return nil, tc.err })
				} else {
					err = stream(nil, ctxOnlyStream{}, &grpc.StreamServerInfo{FullMethod: "/t/M"},
						func(any, grpc.ServerStream) error { return tc.err })
				}
				msg := status.Convert(err).Message()
				if status.Code(err) != tc.code {
					t.Fatalf("code %v, want %v (%v)", status.Code(err), tc.code, err)
				}
				if !tc.hidden {
					if msg != tc.wantText || logs.Len() != 0 {
						t.Fatalf("message %q (want %q), logged %q", msg, tc.wantText, logs.String())
					}
					return
				}
				m := idRE.FindStringSubmatch(msg)
				if m == nil || strings.Contains(msg, "/var/lib") {
					t.Fatalf("the client got %q", msg)
				}
				line := logs.String()
				if !strings.Contains(line, "level=ERROR") || !strings.Contains(line, "id="+m[1]) || !strings.Contains(line, "permission denied") {
					t.Fatalf("log line %q lacks the level, the id %s or the error", line, m[1])
				}
			})
		}
	}
	// Two failures get two ids.
	unary, _ := mapErrors(slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)), nil)
	call := func() string {
		_, err := unary(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/t/M"},
			func(context.Context, any) (any, error) { return nil, errors.New("boom") })
		return status.Convert(err).Message()
	}
	if a, b := call(), call(); a == b {
		t.Fatalf("two internal errors share an id: %q", a)
	}
}
