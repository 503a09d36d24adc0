package api

import (
	"context"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/internal/guard"
)

// A panicking handler answers Internal, counted, instead of ending the
// process: gRPC itself does not recover.
func TestHandlerPanicAnswersInternal(t *testing.T) {
	panics := guard.New(prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	unary, stream := mapErrors(slog.New(slog.DiscardHandler), panics)
	_, err := unary(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/t/Unary"},
		func(context.Context, any) (any, error) { panic("bug") })
	if status.Code(err) != codes.Internal {
		t.Fatalf("unary: %v, want Internal", err)
	}
	err = stream(nil, nil, &grpc.StreamServerInfo{FullMethod: "/t/Stream"},
		func(any, grpc.ServerStream) error { var m map[string]int; m["x"]++; return nil })
	if status.Code(err) != codes.Internal {
		t.Fatalf("stream: %v, want Internal", err)
	}
	if n := testutil.ToFloat64(panics.Count.WithLabelValues("grpc")); n != 2 {
		t.Fatalf("counted %v panics, want 2", n)
	}
}
