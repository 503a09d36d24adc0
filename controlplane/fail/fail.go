// Package fail builds the gRPC errors of the code table in docs/design.md §0.8 and
// maps everything else onto it. Domain packages return these (SPIRE's API
// services do the same); the server's last interceptor passes every error
// through From, so codes.Unknown never reaches a client.
package fail

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/apierr"
	"github.com/tetherfleet/tether/providers"
)

// Invalid is InvalidArgument naming the field.
func Invalid(field, format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, "%s: %s", field, fmt.Sprintf(format, args...))
}

// NotFound is NotFound.
func NotFound(format string, args ...any) error {
	return status.Errorf(codes.NotFound, format, args...)
}

// Exists is AlreadyExists.
func Exists(format string, args ...any) error {
	return status.Errorf(codes.AlreadyExists, format, args...)
}

// Precondition is FailedPrecondition; say the current and allowed states.
func Precondition(format string, args ...any) error {
	return status.Errorf(codes.FailedPrecondition, format, args...)
}

// Exhausted is ResourceExhausted.
func Exhausted(format string, args ...any) error {
	return status.Errorf(codes.ResourceExhausted, format, args...)
}

// Unauthenticated is Unauthenticated.
func Unauthenticated(format string, args ...any) error {
	return status.Errorf(codes.Unauthenticated, format, args...)
}

// Denied is PermissionDenied.
func Denied(format string, args ...any) error {
	return status.Errorf(codes.PermissionDenied, format, args...)
}

// Unavailable is Unavailable: transient, retry.
func Unavailable(format string, args ...any) error {
	return status.Errorf(codes.Unavailable, format, args...)
}

// Internal is a bug.
func Internal(format string, args ...any) error {
	return status.Errorf(codes.Internal, format, args...)
}

// From maps any error to a status error with a code from the table.
func From(err error) error {
	if err == nil {
		return nil
	}
	if s, ok := status.FromError(err); ok && s.Code() != codes.Unknown {
		return err
	}
	var te *lifecycle.TransitionError
	var pe *providers.Error
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.As(err, &te):
		return status.Error(codes.FailedPrecondition, te.Error())
	case errors.Is(err, store.ErrNotFound):
		return status.Error(codes.NotFound, trimSentinel(err, store.ErrNotFound))
	case errors.Is(err, store.ErrAlreadyExists):
		return status.Error(codes.AlreadyExists, trimSentinel(err, store.ErrAlreadyExists))
	case errors.Is(err, store.ErrConflict):
		return status.Error(codes.FailedPrecondition, trimSentinel(err, store.ErrConflict))
	case errors.Is(err, store.ErrUnavailable):
		// The reason detail lets clients recognise this without reading the words.
		return apierr.New(codes.Unavailable, apierr.DatabaseUnavailable, "the database is unavailable; retry shortly ("+err.Error()+")")
	case errors.As(err, &pe):
		return status.Error(providerCode(pe.Kind), err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

func providerCode(k providers.Kind) codes.Code {
	switch k {
	case providers.KindNotFound:
		return codes.FailedPrecondition // the machine is gone: an operation on it cannot proceed
	case providers.KindTransient:
		return codes.Unavailable
	case providers.KindQuota:
		return codes.ResourceExhausted
	case providers.KindUnsupported:
		return codes.FailedPrecondition
	default:
		return codes.FailedPrecondition
	}
}

// trimSentinel drops the sentinel's own text from the end of a message:
// "instance \"x\": not found" reads better as "instance \"x\" not found".
func trimSentinel(err, sentinel error) string {
	msg := err.Error()
	suffix := ": " + sentinel.Error()
	if strings.HasSuffix(msg, suffix) {
		return strings.TrimSuffix(msg, suffix) + " " + sentinel.Error()
	}
	return msg
}

// Code returns the code From would give err.
func Code(err error) codes.Code { return status.Code(From(err)) }
