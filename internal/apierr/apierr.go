// Package apierr names the machine-readable reasons tetherd attaches to a
// gRPC status (as a google.rpc.ErrorInfo detail), so that clients branch on
// a reason instead of on the words of a message that may change.
package apierr

import (
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Domain is the ErrorInfo domain of every reason below.
const Domain = "tether"

// Reasons.
const (
	// DatabaseUnavailable: tetherd answers but its store does not; the
	// client should retry, the server reconnects by itself.
	DatabaseUnavailable = "DATABASE_UNAVAILABLE"
)

// New is a status error with code, message and an ErrorInfo naming reason.
// If the detail cannot be attached the plain status is returned: the code
// and message still hold.
func New(code codes.Code, reason, msg string) error {
	st := status.New(code, msg)
	if withInfo, err := st.WithDetails(&errdetails.ErrorInfo{Domain: Domain, Reason: reason}); err == nil {
		st = withInfo
	}
	return st.Err()
}

// Reason is the tether ErrorInfo reason err carries, or "".
func Reason(err error) string {
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) {
		return ""
	}
	for _, d := range se.GRPCStatus().Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == Domain {
			return info.GetReason()
		}
	}
	return ""
}
